"""Immutable values that the engine produces and consumes.

Everything here may cross threads: frozen dataclasses of plain Python values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Any, Literal

FinishReason = Literal["stop", "length", "cancelled", "error"]
Role = Literal["system", "user", "assistant"]
AcceptRule = Literal["leviathan", "match"]


class Origin(IntEnum):
    """Which model produced a token of the reply."""

    TARGET = 0
    """Plain decoding: the target proposed and chose it."""
    DRAFT = 1
    """A token of the draft model that the target accepted."""
    CORRECTION = 2
    """The target's token after it rejected a drafted token."""
    BONUS = 3
    """The target's extra token after it accepted every drafted token."""
    LOOKUP = 4
    """A token proposed by prompt lookup that the target accepted."""

    @property
    def code(self) -> str:
        """One-letter code, used to store origins compactly."""
        return _ORIGIN_CODES[self]

    @property
    def drafted(self) -> bool:
        """Whether the token was proposed by a drafter and accepted."""
        return self in (Origin.DRAFT, Origin.LOOKUP)

    @classmethod
    def from_code(cls, code: str) -> Origin:
        return cls(_ORIGIN_CODES.index(code))


_ORIGIN_CODES = "tdcbl"


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
        top_p: Nucleus sampling threshold; 0 or 1 turns it off.
        top_k: Sample among the k likeliest tokens; 0 turns it off.
        min_p: Drop tokens below this share of the likeliest; 0 turns it off.
        repetition_penalty: Penalty of recently seen tokens; 1 turns it off.
        repetition_context_size: How many recent tokens the penalty looks at.
        seed: Seed of the sampler; ``None`` leaves the generator as it is.
        num_draft: Draft tokens per round (k); 0 turns speculation off and
            ``None`` adapts k each round within [1, k_max].
        k_max: Upper bound of an adaptive k.
        prompt_lookup: Propose tokens by n-gram lookup in the conversation,
            alone or before the draft model.
        accept_rule: ``"leviathan"`` (lossless, accepts with min(1, p/q)) or
            ``"match"`` (mlx-lm's rule, for comparison).
    """

    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_context_size: int = 20
    seed: int | None = None
    num_draft: int | None = None
    k_max: int = 16
    prompt_lookup: bool = False
    accept_rule: AcceptRule = "leviathan"


Segment = tuple["Origin | None", str]  # a run of reply text and the origin of its tokens


def add_segments(
    segments: list[Segment], pieces: Sequence[str], origins: Sequence[Origin | None]
) -> None:
    """Appends each token's text to ``segments``, merging runs of one origin."""
    for piece, origin in zip(pieces, origins, strict=True):
        if not piece:
            continue
        if segments and segments[-1][0] == origin:
            segments[-1] = (origin, segments[-1][1] + piece)
        else:
            segments.append((origin, piece))


@dataclass(frozen=True, slots=True)
class RoundStat:
    """One round of decoding, as the live gauge sees it.

    Attributes:
        tokens: Tokens the round committed (after any end-of-sequence cut).
        k: Tokens proposed in the round; 0 for a plain target step.
        accepted: Proposed tokens the target accepted (the first ``accepted``
            positions survived, position ``accepted + 1`` was rejected if ``< k``).
        lookup: Of the accepted tokens, how many prompt lookup proposed.
        seconds: Wall time of the round.
        draft_seconds: Of it, time spent drafting (estimated on most rounds).
        auto: Whether k was chosen by the adaptive controller.
    """

    tokens: int
    k: int
    accepted: int
    lookup: int = 0
    seconds: float = 0.0
    draft_seconds: float = 0.0
    auto: bool = False


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of the streamed reply: its text and the tokens behind it.

    Attributes:
        text: New text (may be empty while a multi-byte character is incomplete).
        token_ids: The tokens behind it.
        origins: Each token's origin.
        pieces: Each token's text, aligned with ``token_ids``; their concatenation
            is ``text`` (a token that completes a character carries its bytes).
        round: The round that produced the tokens; ``None`` for trailing text.
        baseline_tps: The pair's measured plain decoding speed, when known.
    """

    text: str
    token_ids: tuple[int, ...]
    origins: tuple[Origin, ...]
    pieces: tuple[str, ...] = ()
    round: RoundStat | None = None
    baseline_tps: float | None = None


@dataclass(frozen=True, slots=True)
class Stats:
    """Per-message statistics.

    Attributes:
        prompt_tokens: Tokens of the prompt.
        reused_tokens: Prompt tokens whose KV cache was kept from the previous turn.
        tokens: Tokens generated.
        drafted: Tokens proposed by the drafters.
        accepted: Proposed tokens the target accepted.
        lookup_accepted: Of those, proposed by prompt lookup.
        target_calls: Target forwards after the prompt (one per round).
        draft_rounds: Rounds that verified proposals.
        num_draft: The fixed k, or ``None`` when k adapted.
        k_min: Smallest k chosen in a drafting round.
        k_max: Largest k chosen in a drafting round.
        draft_seconds: Time spent drafting.
        verify_seconds: Time spent in target forwards after the prompt.
        baseline_tps: Measured plain decoding speed of the target, if known.
        stats_scope: For a remote engine, how far ``drafted`` and ``accepted``
            reach: ``"request"``, ``"server"`` (server-wide counters over the
            reply) or ``"not reported"``; ``None`` for a local pair, measured here.
    """

    prompt_tokens: int = 0
    reused_tokens: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    lookup_accepted: int = 0
    target_calls: int = 0
    draft_rounds: int = 0
    num_draft: int | None = 0
    k_min: int = 0
    k_max: int = 0
    prompt_seconds: float = 0.0
    generation_seconds: float = 0.0
    ttft_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    baseline_tps: float | None = None
    stats_scope: str | None = None

    @property
    def acceptance(self) -> float | None:
        """Accepted over drafted tokens; ``None`` when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted(self) -> float | None:
        """Accepted tokens per drafting round."""
        return self.accepted / self.draft_rounds if self.draft_rounds else None

    @property
    def tokens_per_call(self) -> float | None:
        """Generated tokens per target forward."""
        return self.tokens / self.target_calls if self.target_calls else None

    @property
    def speedup(self) -> float | None:
        """Generation speed over the measured plain decoding speed."""
        if not self.baseline_tps or not self.generation_tps:
            return None
        return self.generation_tps / self.baseline_tps

    @property
    def generation_tps(self) -> float:
        return self.tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """All fields plus the derived rates, for JSON."""
        return {
            **asdict(self),
            "acceptance": self.acceptance,
            "mean_accepted": self.mean_accepted,
            "tokens_per_call": self.tokens_per_call,
            "prompt_tps": self.prompt_tps,
            "generation_tps": self.generation_tps,
            "speedup": self.speedup,
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
