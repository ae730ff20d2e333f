"""Immutable values that the engine produces and consumes.

Everything here may cross threads: frozen dataclasses of plain Python values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Literal

FinishReason = Literal["stop", "length", "cancelled", "error"]
Role = Literal["system", "user", "assistant"]


class Origin(IntEnum):
    """Which model produced a token of the reply."""

    TARGET = 0
    """Plain decoding: the target proposed and chose it."""
    DRAFT = 1
    """A draft token that the target accepted."""
    CORRECTION = 2
    """The target's token after it rejected a draft token."""
    BONUS = 3
    """The target's extra token after it accepted every draft token."""

    @property
    def code(self) -> str:
        """One-letter code, used to store origins compactly."""
        return "tdcb"[self]

    @classmethod
    def from_code(cls, code: str) -> Origin:
        return cls("tdcb".index(code))


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message."""

    role: Role
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """How to generate one reply.

    Attributes:
        max_tokens: Upper bound on generated tokens.
        temperature: 0 for exact greedy decoding; above 0 samples.
        seed: Seed of the sampler; ``None`` leaves the generator as it is.
        num_draft: Draft tokens per round (k); 0 turns speculation off.
    """

    max_tokens: int = 512
    temperature: float = 0.0
    seed: int | None = None
    num_draft: int = 4


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of the streamed reply: its text and the tokens behind it."""

    text: str
    token_ids: tuple[int, ...]
    origins: tuple[Origin, ...]


@dataclass(frozen=True, slots=True)
class Stats:
    """Per-message statistics."""

    prompt_tokens: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    target_calls: int = 0
    num_draft: int = 0
    prompt_seconds: float = 0.0
    generation_seconds: float = 0.0
    ttft_seconds: float = 0.0

    @property
    def acceptance(self) -> float | None:
        """Accepted over drafted tokens; ``None`` when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def generation_tps(self) -> float:
        return self.tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """All fields plus the derived rates, for JSON."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "tokens": self.tokens,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": self.acceptance,
            "target_calls": self.target_calls,
            "num_draft": self.num_draft,
            "prompt_seconds": self.prompt_seconds,
            "generation_seconds": self.generation_seconds,
            "ttft_seconds": self.ttft_seconds,
            "prompt_tps": self.prompt_tps,
            "generation_tps": self.generation_tps,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Stats:
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, slots=True)
class Finished:
    """The last event of a reply."""

    stats: Stats
    finish_reason: FinishReason
    token_ids: tuple[int, ...] = field(default=())
    origins: tuple[Origin, ...] = field(default=())
