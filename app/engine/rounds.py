"""What a speculative round is made of, for the one decoder (:mod:`app.engine.decoder`).

A round proposes ``k`` tokens (from prompt lookup, the draft model, or lookup
followed by the draft), verifies them with one target forward of ``k + 1``
rows, and commits the accepted prefix plus one token of the target's own
(:func:`judge`). At temperature 0 the output is the target's greedy output;
above 0 the rule of Leviathan et al. (2023) and Chen et al. (2023) keeps the
target's distribution exactly.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import mlx.core as mx
import mlx.nn as nn

from app.engine import attention, recurrent, wide
from app.engine.caches import DEEPSEEK_V4, refusal
from app.engine.sampling import Draws, contexts_for, log_probs, penalize
from app.engine.types import AcceptRule, DraftSetting, GenerationParams, Origin

Source = Literal["none", "draft", "lookup", "lookup+draft"]


class CacheError(Exception):
    """The models' caches cannot do what the request needs."""


@dataclass(frozen=True, slots=True)
class Prefill:
    """Prompt processing is done."""

    prompt_tokens: int
    reused_tokens: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Round:
    """What one round committed, and what it cost."""

    tokens: tuple[int, ...]
    origins: tuple[Origin, ...]
    k: int  # tokens proposed (drafted)
    accepted: int
    source: Source
    seconds: float
    draft_seconds: float
    auto: bool = False  # k was chosen by the adaptive controller
    width: int = 0  # rows of the verification (k + 1 plus any padding)
    # The round waited for its draft before verifying, to split the two costs:
    # it took longer than rounds of its shape take, so it prices no width.
    timed: bool = False


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the target made of a proposal."""

    proposed: list[int]  # the proposal, evaluated
    accepted: int  # its first ``accepted`` tokens survive
    next_token: int  # the target's own token after them (bonus or correction)


class DraftControl:
    """The draft length a running reply uses from its next round on.

    Like the cancel event, it is shared between the thread that sets it (the
    UI) and the engine thread that reads it once per round.
    """

    def __init__(self, setting: DraftSetting) -> None:
        self._lock = threading.Lock()
        self._setting = setting

    @property
    def setting(self) -> DraftSetting:
        """The draft setting of the reply's next round."""
        with self._lock:
            return self._setting

    def set(self, setting: DraftSetting) -> None:
        with self._lock:
            self._setting = setting


def drafting_now(params: GenerationParams, control: DraftControl | None) -> DraftSetting:
    """A reply's draft setting now: its control's where it has one, else what it asked."""
    return control.setting if control is not None else params.drafting


def prepare(target: nn.Module, draft: nn.Module | None) -> str | None:
    """Puts the engine's attention and wide paths, as the options applied say, into both models,
    and notes their recurrent layers' states.

    Returns:
        Why the target's cache cannot be rewound, as verifying drafts needs; None where it can.
    """
    for model in (target, draft):
        if model is not None:
            attention.install(model)
            wide.install(model)
            recurrent.install(model)
            if type(model).__module__ == DEEPSEEK_V4:
                from app.engine import sparse  # its module only where its models run

                sparse.install(model)
    return refusal(target)


def check_drafting(refused: str | None, proposes: bool, wanted: int | None) -> None:
    """Refuses drafting where the target's cache cannot give back rejected rows.

    Raises:
        CacheError: Drafts are asked for (``wanted`` is not 0 and something
            ``proposes``) but the target's cache does not rewind (``refused`` says why).
    """
    if proposes and wanted != 0 and refused is not None:
        raise CacheError(f"the target cannot verify drafts: {refused}; turn drafting off")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _ints(a: mx.array) -> list[int]:
    return cast(list[int], a.tolist())


def fit_vocab(logits: mx.array, size: int) -> mx.array:
    """Draft logits over the target's vocabulary: cut, or padded with -inf.

    Rows past the shared tokens are padding, so the draft never proposes them
    and q is 0 there, which keeps rejection sampling exact.
    """
    vocab = logits.shape[-1]
    if vocab > size:
        return logits[..., :size]
    if vocab < size:
        pad = mx.full((*logits.shape[:-1], size - vocab), -mx.inf, dtype=logits.dtype)
        return mx.concatenate([logits, pad], axis=-1)
    return logits


def verify_sampled(
    p: mx.array,
    q: mx.array,
    proposal: mx.array,
    rule: AcceptRule = "leviathan",
    key: mx.array | None = None,
) -> tuple[mx.array, mx.array]:
    """The accept/resample step of speculative sampling, lazily.

    Args:
        p: ``(k + 1, V)`` target probabilities at each proposed position and after.
        q: ``(k, V)`` proposal probabilities (one-hot rows for deterministic drafts).
        proposal: ``(k,)`` proposed tokens.
        rule: ``"leviathan"`` accepts x with probability min(1, p(x)/q(x)) and
            resamples a rejection from norm(max(0, p - q)); ``"match"`` is
            mlx-lm's rule: accept only if an independent sample from p equals x.
        key: A PRNG key of this reply's own; ``None`` draws from MLX's global state.

    Returns:
        ``accept`` (``(k,)`` booleans) and ``fallback`` (``(k + 1,)`` tokens): the
        token to commit after the first rejection at ``i``, or the bonus at ``k``.
    """
    k = proposal.shape[0]
    keys = list(mx.random.split(key, 3)) if key is not None else [None] * 3
    if rule == "match":
        s = mx.random.categorical(mx.log(p), key=keys[0])
        return s[:k] == proposal, s
    idx = mx.arange(k)
    p_x, q_x = p[idx, proposal], q[idx, proposal]
    accept = mx.random.uniform(shape=(k,), key=keys[0]) * q_x < p_x
    residual = mx.maximum(p[:k] - q, 0.0)
    fallback = mx.concatenate(
        [
            mx.random.categorical(mx.log(residual), key=keys[1]),
            mx.random.categorical(mx.log(p[k:]), key=keys[2]),
        ]
    )
    return accept, fallback


def pick(
    logits: mx.array,
    params: GenerationParams,
    contexts: list[mx.array],
    draws: Draws,
    position: int,
) -> tuple[mx.array, mx.array | None]:
    """Chosen tokens for rows of logits, plus their probabilities when they are a draw's.

    Args:
        draws: The reply's own random draws.
        position: Where in the sequence the first row's token goes.
    """
    logits = penalize(logits, contexts, params.repetition_penalty)
    if not params.sampled:
        return mx.argmax(logits, axis=-1), None
    lp = log_probs(logits, params)
    if draws.coupled:  # the position's own noise decides: a one-hot proposal
        return mx.argmax(lp + draws.noise(position, lp.shape[0], lp.shape[-1]), axis=-1), None
    return mx.random.categorical(lp, key=draws.key(position)), mx.exp(lp)


def penalty_history(seq: Sequence[int], params: GenerationParams) -> mx.array:
    """The tokens the repetition penalty looks at (none when it is off)."""
    size = params.repetition_context_size if params.penalized else 0
    return mx.array(list(seq[-size:]) if size else [], dtype=mx.int32)


def judge(
    logits: mx.array,
    seq: Sequence[int],
    params: GenerationParams,
    tokens: mx.array,
    q_rows: Sequence[mx.array | int],
    draws: Draws,
) -> Verdict:
    """What the target makes of a proposal: how many survive, and its own next token.

    The one acceptance rule of every decoder: greedy keeps the longest prefix
    the target's argmax agrees with, as does coupled sampling with each
    position's noise added (:class:`Draws`); other sampling applies
    ``params.accept_rule``.

    Args:
        logits: ``(k + 1, V)`` target logits at the proposal's positions and after.
        seq: The sequence before the proposal (the repetition penalty's history).
        tokens: ``(k,)`` proposed tokens, ``k`` at least 1.
        q_rows: The proposer's distribution per token (an int: a one-hot row).
        draws: The reply's own random draws.
    """
    k = tokens.shape[0]
    if params.penalized:
        history = penalty_history(seq, params)
        logits = penalize(
            logits,
            contexts_for(history, tokens, k + 1, params.repetition_context_size),
            params.repetition_penalty,
        )
    if not params.sampled or draws.coupled:
        if params.sampled:
            logits = log_probs(logits, params) + draws.noise(len(seq), k + 1, logits.shape[-1])
        choice = mx.argmax(logits, axis=-1)
        mx.eval(tokens, choice)
        proposed, chosen = _ints(tokens), _ints(choice)
        accepted = common_prefix(proposed, chosen[:k])
        return Verdict(proposed, accepted, chosen[accepted])
    target_probs = mx.exp(log_probs(logits, params))
    vocab = target_probs.shape[-1]
    draft_probs = mx.stack(
        [
            row
            if isinstance(row, mx.array)
            else (mx.arange(vocab) == row).astype(target_probs.dtype)
            for row in q_rows
        ]
    )
    key = draws.key(len(seq), "verify")
    keep, fallback = verify_sampled(target_probs, draft_probs, tokens, params.accept_rule, key)
    mx.eval(tokens, keep, fallback)
    kept = cast(list[bool], keep.tolist())
    accepted = kept.index(False) if False in kept else k
    return Verdict(_ints(tokens), accepted, _ints(fallback)[accepted])


def draft_cuts(params: GenerationParams, auto: bool, setting: bool | None = None) -> bool:
    """Whether a round's draft ends once the draft's own probabilities say the rest will fail.

    By default only on Auto's sampled replies: on the CPU's real pair at
    T = 0.7 Auto ran 1.16x and 1.19x as fast with it, greedy within noise
    (docs/benchmarks-history.md); a fixed k drafts the k it was given.

    Args:
        params: The reply's sampling.
        auto: Whether Auto chose the round's k.
        setting: True always, False never, None by default.
    """
    if setting is not None:
        return setting
    return auto and params.sampled


def stop_below(step: float | None, rate: float) -> float:
    """The chance of a draft's tokens so far below which it ends: 0 for never.

    One more draft token must be worth its step: the tokens that the step's
    seconds give at the round's rate.
    """
    return min(step * rate, 0.9) if step and rate > 0 else 0.0


@dataclass(eq=False)
class DraftCutoff:
    """Ends each draft once the draft's own chance of its tokens so far is below its stop.

    One per round, a stop per sequence it drafts for (0: it drafts its k); each
    chance is read one step late, so the device drafts on while Python looks.
    """

    stops: list[float]
    sure: list[list[mx.array]] = field(init=False)
    chain: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.sure = [[] for _ in self.stops]
        self.chain = [1.0] * len(self.stops)

    def note(self, i: int, token: mx.array, probs: mx.array | None, logits: mx.array) -> None:
        """Keeps (lazily) the draft's chance of sequence ``i``'s new ``token``, if it is watched."""
        if self.stops[i] > 0:
            p = probs if probs is not None else mx.softmax(logits, axis=-1)
            self.sure[i].append(mx.take(p[0], token))

    def latest(self, going: Sequence[int]) -> list[mx.array]:
        """The chances this step noted, to evaluate with its tokens."""
        return [self.sure[i][-1] for i in going if self.stops[i] > 0]

    def check(self, ks: list[int], step: int, going: Sequence[int]) -> None:
        """Ends after this step the drafts of ``going`` whose chance so far is below their stop."""
        watched = [i for i in going if self.stops[i] > 0 and step > 0]
        if not watched:
            return
        seen = mx.concatenate([self.sure[i][step - 1] for i in watched]).tolist()
        for i, p in zip(watched, cast(list[float], seen), strict=True):
            self.chain[i] *= p
            if self.chain[i] < self.stops[i]:
                ks[i] = step + 1


def draft_kept(held: list[int], drafted: Sequence[int], committed: Sequence[int]) -> int:
    """Rows of a draft's cache still right after a round: the rest are trimmed.

    Args:
        held: What the draft's cache held before the round, then what its first
            step fed.
        drafted: The draft's tokens but the last (each later step fed one).
        committed: The sequence after the round, its new token included.
    """
    return common_prefix([*held, *drafted], committed)
