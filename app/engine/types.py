"""Immutable values that the engine produces and consumes.

Everything here may cross threads: frozen dataclasses of plain Python values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import IntEnum
from typing import Any, Literal, cast, get_args

from app.engine.costs import K_MAX

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
    MTP = 5
    """A token of the target's own MTP head that the target accepted."""

    @property
    def code(self) -> str:
        """One-letter code, used to store origins compactly."""
        return _ORIGIN_CODES[self]

    @property
    def drafted(self) -> bool:
        """Whether the token was proposed by a drafter and accepted."""
        return self in (Origin.DRAFT, Origin.LOOKUP, Origin.MTP)

    @classmethod
    def from_code(cls, code: str) -> Origin:
        return cls(_ORIGIN_CODES.index(code))


_ORIGIN_CODES = "tdcblm"


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message."""

    role: Role
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


SEED_MAX = 2**64 - 1
"""The largest seed: any unsigned 64-bit seed keys a request's own draws
(:class:`app.engine.sampling.Draws`) as it is, with no reduction."""
MAX_TOKENS_LIMIT = 131_072
"""The longest reply anyone may ask for."""
DEFAULT_MAX_TOKENS = 1024
"""The reply length where a caller says nothing: the window, the CLI and the server."""
TOP_K_MAX = 1_000_000
"""Larger than any vocabulary; a top-k at least the vocabulary's size is off."""


@dataclass(frozen=True, slots=True)
class ParamRange:
    """The values one sampling field may take, bounds included.

    Attributes:
        lo: Smallest value.
        hi: Largest value.
        whole: Only whole numbers (``int``, not ``bool``); otherwise any finite
            ``int`` or ``float``.
        optional: ``None`` is allowed too (it means "unset" or "adapt").
    """

    lo: float
    hi: float
    whole: bool = False
    optional: bool = False

    @property
    def rule(self) -> str:
        """The range in words, such as ``"a number from 0 to 2"``."""
        if self.whole:
            return f"a whole number from {int(self.lo)} to {int(self.hi)}"
        return f"a number from {self.lo:g} to {self.hi:g}"

    def holds(self, value: object) -> bool:
        """Whether ``value`` is in range (NaN and infinities never are)."""
        if value is None:
            return self.optional
        if isinstance(value, bool):
            return False
        if self.whole:
            return type(value) is int and self.lo <= value <= self.hi
        if not isinstance(value, int | float):
            return False
        if isinstance(value, float) and not math.isfinite(value):  # an int is always finite
            return False
        return self.lo <= value <= self.hi


PARAM_RANGES: Mapping[str, ParamRange] = {
    "max_tokens": ParamRange(1, MAX_TOKENS_LIMIT, whole=True),
    "temperature": ParamRange(0.0, 2.0),
    "top_p": ParamRange(0.0, 1.0),
    "top_k": ParamRange(0, TOP_K_MAX, whole=True),
    "min_p": ParamRange(0.0, 1.0),
    # Below 1 rewards repeating; far above 2 only garbles the text.
    "repetition_penalty": ParamRange(1.0, 2.0),
    "repetition_context_size": ParamRange(0, MAX_TOKENS_LIMIT, whole=True),
    "seed": ParamRange(0, SEED_MAX, whole=True, optional=True),
    "num_draft": ParamRange(0, K_MAX, whole=True),
    "k_max": ParamRange(1, K_MAX, whole=True),
}
"""Every sampling field's range, and a draft setting's (``num_draft`` its k,
``k_max`` its limit): the one definition that :class:`Sampling` and
:class:`DraftSetting` check against, and that the window's controls show."""


class InvalidParamError(ValueError):
    """A sampling value out of its range; ``name`` is the field's name.

    Attributes:
        name: The :class:`GenerationParams` field.
        value: The value refused.
        rule: The range in words, for callers that name the field their own way.
    """

    def __init__(self, name: str, value: object, rule: str) -> None:
        super().__init__(f"{name} must be {rule}, not {value!r}")
        self.name = name
        self.value = value
        self.rule = rule


def check_param(name: str, value: object) -> None:
    """Refuses ``value`` unless it is in the range of the sampling field ``name``.

    Raises:
        InvalidParamError: It is not (NaN, infinities and booleans never are).
    """
    bounds = PARAM_RANGES[name]
    if not bounds.holds(value):
        raise InvalidParamError(name, value, bounds.rule)


class InvalidTextError(ValueError):
    """Text that is not valid Unicode (a lone surrogate, or undecodable bytes)."""


def check_text(text: str, what: str = "the text") -> None:
    """Refuses text that cannot be encoded as UTF-8, which no tokenizer takes.

    A lone surrogate comes from a JSON escape such as ``"\\ud800"`` or, on the
    command line, from bytes that are not UTF-8 (Python keeps them as surrogates).

    Raises:
        InvalidTextError: Naming ``what`` and the position of the first bad character.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidTextError(
            f"{what} is not valid UTF-8 text (character {exc.start + 1} is "
            f"{ascii(text[exc.start])[1:-1]}, a lone surrogate or an undecodable byte)"
        ) from None


@dataclass(frozen=True, slots=True)
class DraftSetting:
    """How far the drafters run ahead: a fixed k (0: off), or Auto within a limit.

    The one value from the slider, a preset, the CLI or a request down to the
    engine, checked where it is made.

    Attributes:
        k: Tokens proposed per round while Auto is off; 0 turns speculation off.
            Auto keeps it, as the slider shows it while Auto plans.
        auto: The engine plans k each round from this machine's measured costs.
        limit: The longest draft a round proposes, Auto's or fixed.

    Raises:
        InvalidParamError: ``k`` (as ``num_draft``) or ``limit`` (as ``k_max``)
            is out of its range, or ``auto`` is not a bool.
    """

    k: int = 4
    auto: bool = True
    limit: int = K_MAX

    def __post_init__(self) -> None:
        check_param("num_draft", self.k)
        check_param("k_max", self.limit)
        if type(self.auto) is not bool:
            raise InvalidParamError("auto", self.auto, "true or false")

    @classmethod
    def fixed(cls, k: int, limit: int = K_MAX) -> DraftSetting:
        """``k`` tokens every round (0: off)."""
        return cls(k, auto=False, limit=limit)

    @classmethod
    def of(cls, num_draft: int | None, limit: int = K_MAX) -> DraftSetting:
        """The setting that drafts ``num_draft`` tokens a round (``None``: Auto)."""
        return cls(auto=True, limit=limit) if num_draft is None else cls.fixed(num_draft, limit)

    @classmethod
    def parse(cls, value: object, limit: int = K_MAX) -> DraftSetting:
        """A draft length as a person or a client writes it: ``"auto"`` or a whole number.

        The one reading of a written draft length, for the CLI and the server.

        Raises:
            InvalidParamError: Anything else, or a number out of range.
        """
        if value == "auto":
            return cls.of(None, limit)
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        bounds = PARAM_RANGES["num_draft"]
        if not bounds.holds(value):
            raise InvalidParamError("num_draft", value, f"'auto' or {bounds.rule}")
        return cls.fixed(cast(int, value), limit)

    @property
    def num_draft(self) -> int | None:
        """Tokens every round proposes; ``None`` where Auto plans each round's."""
        return None if self.auto else self.k

    @property
    def off(self) -> bool:
        """Whether nothing is drafted: a fixed k of 0."""
        return not self.auto and self.k == 0

    def __str__(self) -> str:
        """``auto`` or the fixed k, as the CLI and the server write it (:meth:`parse` reads it)."""
        return "auto" if self.auto else str(self.k)


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """How a reply is sampled and drafted: the fields settings, presets and
    :class:`GenerationParams` share, declared here once.

    Attributes:
        max_tokens: Upper bound on generated tokens.
        temperature: 0 for exact greedy decoding; above 0 samples.
        top_p: Nucleus sampling threshold; 0 or 1 turns it off.
        top_k: Sample among the k likeliest tokens; 0 turns it off.
        min_p: Drop tokens below this share of the likeliest; 0 turns it off.
        repetition_penalty: Penalty of recently seen tokens; 1 turns it off.
        seed: Keys the reply's own random draws, 0 to :data:`SEED_MAX`;
            ``None`` draws a fresh key.
        drafting: The draft length: fixed, off, or Auto within a limit.
        prompt_lookup: Propose tokens by n-gram lookup in the conversation,
            alone or before the draft model.

    Raises:
        InvalidParamError: A field is out of range (the first one, by name).
    """

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    drafting: DraftSetting = DraftSetting()
    prompt_lookup: bool = False

    def __post_init__(self) -> None:
        for name in SAMPLING_FIELDS:
            check_param(name, getattr(self, name))
        if type(self.drafting) is not DraftSetting:
            raise InvalidParamError("drafting", self.drafting, "a DraftSetting")
        if type(self.prompt_lookup) is not bool:
            raise InvalidParamError("prompt_lookup", self.prompt_lookup, "true or false")

    def sampling(self) -> dict[str, Any]:
        """This value's :class:`Sampling` fields by name, to make another kind of value from."""
        return {f.name: getattr(self, f.name) for f in fields(Sampling)}

    @property
    def sampled(self) -> bool:
        """Whether tokens are drawn (temperature above 0) rather than the argmax."""
        return self.temperature > 0

    @property
    def penalized(self) -> bool:
        """Whether the repetition penalty changes any logit."""
        return self.repetition_penalty != 1.0


SAMPLING_FIELDS = tuple(f.name for f in fields(Sampling) if f.name in PARAM_RANGES)
"""The :class:`Sampling` fields with a range in :data:`PARAM_RANGES`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationParams(Sampling):
    """How to generate one reply: its :class:`Sampling` and what only a request asks.

    Attributes:
        repetition_context_size: How many recent tokens the penalty looks at.
        accept_rule: ``"leviathan"`` (lossless, accepts with min(1, p/q)) or
            ``"match"`` (mlx-lm's rule, for comparison).
    """

    repetition_context_size: int = 20
    accept_rule: AcceptRule = "leviathan"

    def __post_init__(self) -> None:
        Sampling.__post_init__(self)  # slots: no argument-less super() here
        check_param("repetition_context_size", self.repetition_context_size)
        if self.accept_rule not in get_args(AcceptRule):
            raise InvalidParamError("accept_rule", self.accept_rule, "'leviathan' or 'match'")


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


def decode_rate(tokens: int, seconds: float) -> float | None:
    """Tokens per second of decoding; ``None`` when no decoding time was measured.

    The one definition of a reply's speed: tokens committed over the time the
    rounds that committed them took (drafting plus verifying), never the prompt,
    the wait for a queued request or the time between rounds.
    """
    return tokens / seconds if seconds > 0 else None


# Fewer tokens than this time the first steps' overheads, not a speed: no speedup is given.
MIN_TIMED_TOKENS = 16


def speedup_over(tps: float | None, baseline_tps: float | None, tokens: int) -> float | None:
    """``tps`` over the measured plain decoding speed, for a reply of ``tokens``.

    ``None`` if either speed is unknown or the reply is shorter than
    :data:`MIN_TIMED_TOKENS` (a reply that committed nothing has no speedup
    either, not 0×); :func:`speedup_missing` says which.
    """
    if not tps or not baseline_tps or baseline_tps <= 0 or tokens < MIN_TIMED_TOKENS:
        return None
    return tps / baseline_tps


def speedup_missing(baseline_tps: float | None, tokens: int) -> str:
    """Why a reply has no speedup, in the words every view shows."""
    if baseline_tps is None:
        return "plain speed not measured yet"
    if tokens < MIN_TIMED_TOKENS:
        return "too short to measure"
    return "not measured"


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
        prompt_tokens: Tokens of the reply's prompt, when the engine knows them.
    """

    text: str
    token_ids: tuple[int, ...]
    origins: tuple[Origin, ...]
    pieces: tuple[str, ...] = ()
    round: RoundStat | None = None
    baseline_tps: float | None = None
    prompt_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Reading:
    """The target is reading the prompt: ``done`` of its ``total`` tokens are in its cache.

    A reply yields one before each chunk of prompt processing, so a long prompt
    shows progress before its first token.

    Attributes:
        done: Prompt tokens in the cache so far, the reused ones included.
        total: Tokens of the whole prompt.
        reused: Tokens the cache held already from an earlier turn.
    """

    done: int
    total: int
    reused: int = 0

    @property
    def fraction(self) -> float:
        """The share of the prompt read, from 0 to 1."""
        return self.done / self.total if self.total > 0 else 1.0


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
        k_sum: The k chosen, summed over drafting rounds (``drafted`` counts only
            the drafts inside the reply, so a round cut at its end counts fewer).
        draft_seconds: Time spent drafting.
        verify_seconds: Time spent in target forwards after the prompt.
        baseline_tps: Measured plain decoding speed of the target, if known.
        stats_scope: For a remote engine, how far ``drafted`` and ``accepted``
            reach: ``"request"``, ``"server"`` (server-wide counters over the
            reply) or ``"not reported"``; ``None`` for a local pair, measured here.
        capped_by_window: The reply ended at the end of the target's context
            window, before its ``max_tokens`` (its finish reason is ``"length"``).
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
    k_sum: int = 0
    prompt_seconds: float = 0.0
    generation_seconds: float = 0.0
    ttft_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    baseline_tps: float | None = None
    stats_scope: str | None = None
    capped_by_window: bool = False

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
    def decode_seconds(self) -> float:
        """Time spent decoding: the rounds' drafting plus verifying.

        ``generation_seconds`` also counts what is not decoding (tokenizing,
        the wait between rounds, the end of a stopped reply), so it is only the
        fallback, for a remote engine that times no rounds of its own.
        """
        rounds = self.draft_seconds + self.verify_seconds
        return rounds if rounds > 0 else self.generation_seconds

    @property
    def speedup(self) -> float | None:
        """:attr:`generation_tps` over the measured plain decoding speed."""
        rate = decode_rate(self.tokens, self.decode_seconds)
        return speedup_over(rate, self.baseline_tps, self.tokens)

    @property
    def generation_tps(self) -> float:
        """Decoding speed (see :func:`decode_rate`); 0 when no time was measured."""
        return decode_rate(self.tokens, self.decode_seconds) or 0.0

    @property
    def context_tokens(self) -> int:
        """Tokens of the target's window the conversation fills after this reply."""
        return self.prompt_tokens + self.tokens

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
            "decode_seconds": self.decode_seconds,
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
