"""Tandem's speculative decoding loop.

A round proposes ``k`` tokens (from prompt lookup, the draft model, or lookup
followed by the draft), verifies them with one target forward of ``k + 1``
tokens, and commits the accepted prefix plus one token of the target's own. At
temperature 0 the output is the target's greedy output; above 0 the rule of
Leviathan et al. (2023) and Chen et al. (2023) keeps the target's distribution
exactly. Both models' KV caches persist across turns: a follow-up turn
prefills only what the cache does not already hold.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

import mlx.core as mx
import mlx.nn as nn

from app.engine import attention, wide
from app.engine.adaptive import Acceptance, DraftLength
from app.engine.caches import can_rewind, new_cache, rewind
from app.engine.costs import K_MAX, CostModel, PlainPace, Plan, Samples
from app.engine.lookup import PromptLookup
from app.engine.observe import Observer, PlainBurst, PrefillChunk, RoundPlanned, RoundRun
from app.engine.options import DEFAULT_OPTIONS, EngineOptions
from app.engine.sampling import Draws, contexts_for, log_probs, penalize
from app.engine.stretch import FRESH, Belief
from app.engine.types import AcceptRule, GenerationParams, Origin, Reading

PREFILL_STEP = 512
CATCH_UP_STEP = 128  # draft prompt tokens fed between two of the first plain steps
ROUND_LAG = 2 * K_MAX + 2  # tokens a round feeds the draft with its first step
TIME_DRAFT_EVERY = 8  # sync after drafting this often to split draft and verify time

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


def _target_round(tokens: tuple[int, ...], seconds: float) -> Round:
    """A round of plain target steps: nothing proposed, one row each."""
    return Round(
        tokens=tokens,
        origins=(Origin.TARGET,) * len(tokens),
        k=0,
        accepted=0,
        source="none",
        seconds=seconds,
        draft_seconds=0.0,
        width=1,
    )


@dataclass(frozen=True, slots=True)
class _Proposal:
    """What a round proposes: prompt lookup's tokens, then the draft's."""

    tokens: mx.array  # every proposed token, queued
    q_rows: list[mx.array | int]  # the proposer's distribution per token (an int: one-hot)
    looked_up: int
    drafted: int
    fed: list[int]  # tokens fed to the draft's cache ahead of its first step
    filler: int  # the token padding rows repeat (any token: no logit of theirs is read)
    first_at: float | None = None  # when the first draft step was done, where timed

    @property
    def size(self) -> int:
        return self.looked_up + self.drafted

    @property
    def source(self) -> Source:
        if self.looked_up and self.drafted:
            return "lookup+draft"
        return "lookup" if self.looked_up else "draft"


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

    def __init__(self, num_draft: int | None = None) -> None:
        self._lock = threading.Lock()
        self._num_draft = num_draft

    @property
    def num_draft(self) -> int | None:
        """Tokens to draft per round: 0 turns speculation off, ``None`` adapts."""
        with self._lock:
            return self._num_draft

    def set(self, num_draft: int | None) -> None:
        if num_draft is not None and not 0 <= num_draft <= K_MAX:
            raise ValueError(f"num_draft must be from 0 to {K_MAX}, not {num_draft}")
        with self._lock:
            self._num_draft = num_draft


def prefill_steps(
    model: nn.Module,
    cache: list[Any],
    tokens: Sequence[int],
    step: int = PREFILL_STEP,
    stop: Callable[[], bool] | None = None,
) -> Iterator[int]:
    """Runs ``tokens`` through ``model`` into ``cache`` in chunks of ``step``.

    Args:
        stop: Asked before each chunk; once true, prefilling ends there.

    Yields:
        Tokens fed so far, after each chunk: the cache holds them whenever the
        caller looks.
    """
    for i in range(0, len(tokens), step):
        if stop is not None and stop():
            return
        rows, pad = attention.padded(tokens[i : i + step], cache)
        model(mx.array(rows)[None], cache=cache)
        if pad:
            rewind(cache, pad)  # the pad's rows are read for their shape only
        mx.eval([c.state for c in cache])
        yield min(i + step, len(tokens))


def prefill(
    model: nn.Module,
    cache: list[Any],
    tokens: Sequence[int],
    step: int = PREFILL_STEP,
    stop: Callable[[], bool] | None = None,
) -> int:
    """Runs ``tokens`` through ``model`` into ``cache`` in chunks of ``step``.

    Args:
        stop: Asked before each chunk; once true, prefilling ends there.

    Returns:
        Tokens fed (fewer than ``tokens`` only when stopped).
    """
    return max(prefill_steps(model, cache, tokens, step, stop), default=0)  # counts only grow


def prepare(target: nn.Module, draft: nn.Module | None) -> bool:
    """Puts the engine's attention and wide paths, as the options applied say, into both models.

    Returns:
        Whether the target's cache can be rewound, as verifying drafts needs.
    """
    for model in (target, draft):
        if model is not None:
            attention.install(model)
            wide.install(model)
    return can_rewind(new_cache(target))


def check_drafting(rewinds: bool, proposes: bool, wanted: int | None) -> None:
    """Refuses drafting where the target's cache cannot give back rejected rows.

    Raises:
        CacheError: Drafts are asked for (``wanted`` is not 0 and something
            ``proposes``) but the target's cache does not rewind.
    """
    if proposes and wanted != 0 and not rewinds:
        raise CacheError(
            "the target's cache cannot be rewound (hybrid or recurrent layers), "
            "so it cannot verify drafts; turn drafting off"
        )


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _cut_back(
    cache: list[Any] | None, cached: list[int], tokens: list[int]
) -> tuple[list[Any] | None, list[int]]:
    """``cache`` cut back to the prefix it shares with ``tokens``.

    Returns:
        The cache (``None`` when it had to go back but cannot be trimmed) and
        the tokens it then holds.
    """
    held = len(cached)
    # Asked every round: compare the lists whole (fast) before walking them.
    if cache is None or (held <= len(tokens) and cached == tokens[:held]):
        return cache, cached
    n = common_prefix(cached, tokens)
    if held == n:
        return cache, cached
    if not rewind(cache, held - n):
        return None, []
    return cache, cached[:n]


def _ints(a: mx.array) -> list[int]:
    return cast(list[int], a.tolist())


def _logits(model: nn.Module, tokens: mx.array, cache: list[Any]) -> mx.array:
    logits: mx.array = model(tokens[None], cache=cache)[0].astype(mx.float32)
    return logits


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
    if params.temperature == 0:
        return mx.argmax(logits, axis=-1), None
    lp = log_probs(logits, params)
    if draws.coupled:  # the position's own noise decides: a one-hot proposal
        return mx.argmax(lp + draws.noise(position, lp.shape[0], lp.shape[-1]), axis=-1), None
    return mx.random.categorical(lp, key=draws.key(position)), mx.exp(lp)


def penalty_history(seq: Sequence[int], params: GenerationParams) -> mx.array:
    """The tokens the repetition penalty looks at (none when it is off)."""
    size = params.repetition_context_size if params.repetition_penalty != 1.0 else 0
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
    if params.repetition_penalty != 1.0:
        history = penalty_history(seq, params)
        logits = penalize(
            logits,
            contexts_for(history, tokens, k + 1, params.repetition_context_size),
            params.repetition_penalty,
        )
    if params.temperature == 0 or draws.coupled:
        if params.temperature > 0:
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
    return auto and params.temperature > 0


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


class Decoder:
    """Speculative decoding with a target and an optional draft model.

    Owns both models' KV caches and keeps them between turns, so it belongs to
    the one thread that runs the models.

    Args:
        target: The model whose output the user gets.
        draft: The model that proposes tokens, if any.
        costs: The pair's measured costs (a stored profile, say); a fresh model
            measures them as replies run.
    """

    def __init__(
        self,
        target: nn.Module,
        draft: nn.Module | None = None,
        costs: CostModel | None = None,
        options: EngineOptions = DEFAULT_OPTIONS,
    ) -> None:
        self.target = target
        self.draft = draft
        # Whether the target's cache can be rewound; learned on the first reply,
        # so that making a decoder costs nothing until it decodes.
        self.target_trimmable: bool | None = None
        self.vocab_size: int | None = getattr(getattr(target, "args", None), "vocab_size", None)
        self._t_cache: list[Any] | None = None
        self._t_tokens: list[int] = []
        self._d_cache: list[Any] | None = None
        self._d_tokens: list[int] = []
        self.options = options
        # Seconds of one plain target step: a median that a cold first step (weights
        # still paging in) cannot drag along, the baseline of every speedup shown.
        self._step = Samples()
        self.costs = costs if costs is not None else CostModel()
        # Acceptance per (sampling, lookup) and controllers per setting outlive
        # turns: the pair's behaviour does not change between them.
        self._acceptance: dict[tuple[bool, bool], Acceptance] = {}
        self._lengths: dict[tuple[int, int | None, bool, bool], DraftLength] = {}
        self._cancel: threading.Event | None = None  # the running reply's, while it runs
        self._draws = Draws(None)  # the running reply's
        self.observer: Observer | None = None  # told what each round planned and cost

    def _cuts(self, params: GenerationParams, auto: bool) -> bool:
        """Whether a round's draft may end early (:func:`draft_cuts`, by this decoder's setting)."""
        return draft_cuts(params, auto, self.options.draft_cutoff)

    def _stopped(self) -> bool:
        """Whether the running reply was cancelled (asked between draft steps too)."""
        return self._cancel is not None and self._cancel.is_set()

    @property
    def baseline_tps(self) -> float | None:
        """Plain decoding speed of the target, measured on warm plain steps.

        ``None`` until a probe after the first was timed (the first runs cold), so
        no speedup is shown against a guess.
        """
        v = self._step.value
        return 1.0 / v if v else None

    def acceptance(self, sampling: bool = False, lookup: bool = False) -> Acceptance:
        """The running acceptance of greedy or sampled drafting, with or without lookup."""
        return self._acceptance.setdefault((sampling, lookup), Acceptance())

    def draft_length(self, params: GenerationParams, num_draft: int | None) -> DraftLength:
        """The controller of this reply's setting (shared with earlier replies)."""
        sampling, lookup = params.temperature > 0, params.prompt_lookup
        key = (params.k_max, num_draft, sampling, lookup)
        if key not in self._lengths:
            accept = self.acceptance(sampling, lookup)
            self._lengths[key] = DraftLength(params.k_max, num_draft, self.costs, accept)
        return self._lengths[key]

    def reset(self) -> None:
        """Drops both caches (the next turn prefills from scratch)."""
        self._t_cache, self._t_tokens = None, []
        self._d_cache, self._d_tokens = None, []

    @staticmethod
    def _reuse(
        model: nn.Module, cache: list[Any] | None, cached: list[int], tokens: list[int]
    ) -> tuple[list[Any], list[int]]:
        """``cache`` cut back to the prefix it shares with ``tokens``; a new one if it cannot be."""
        cache, cached = _cut_back(cache, cached, tokens)
        if cache is None:
            return new_cache(model), []
        return cache, cached

    def _prepare(
        self,
        model: nn.Module,
        cache: list[Any] | None,
        cached: list[int],
        tokens: list[int],
        limit: int | None = None,
    ) -> tuple[list[Any], list[int], int]:
        """Makes ``cache`` hold ``tokens`` (at most ``limit`` more), reusing the common prefix."""
        cache, cached = self._reuse(model, cache, cached, tokens)
        n = len(cached)
        end = len(tokens) if limit is None else min(len(tokens), n + limit)
        step = min(PREFILL_STEP, limit or PREFILL_STEP)
        fed = prefill(model, cache, tokens[n:end], step, stop=self._stopped)
        return cache, list(tokens[: n + fed]), n

    def generate(
        self,
        prompt: Sequence[int],
        params: GenerationParams,
        control: DraftControl | None = None,
        cancel: threading.Event | None = None,
        reading: bool = False,
    ) -> Generator[Reading | Prefill | Round, None, None]:
        """Yields a :class:`Prefill`, then rounds until ``cancel`` is set.

        The caller stops pulling on end of sequence or length. ``cancel`` is
        also asked between prompt chunks and draft steps and before a
        verification, so a stop does not wait for a round: the generator then
        ends, and the caches hold only what was committed. With ``control``,
        its draft length replaces ``params.num_draft`` from the next round on.
        With ``reading``, a :class:`Reading` comes before each chunk of the
        prompt the target reads (none when its cache holds all of it already).
        """
        self.options.apply()  # this decoder's paths for this reply, whatever ran before
        if self.target_trimmable is None:
            self.target_trimmable = prepare(self.target, self.draft)
        can_draft = self.draft is not None
        can_lookup = params.prompt_lookup
        wanted = control.num_draft if control is not None else params.num_draft
        check_drafting(self.target_trimmable, can_draft or can_lookup, wanted)
        if not self.target_trimmable:
            can_draft = can_lookup = False
        self._cancel = cancel
        self._draws = Draws(params.seed)
        try:
            yield from self._generate(list(prompt), params, can_draft, can_lookup, control, reading)
        except GeneratorExit:
            raise
        except BaseException:
            self.reset()  # a round broke half-way: the caches are unknown
            raise
        finally:
            self._cancel = None

    def _generate(
        self,
        seq: list[int],
        params: GenerationParams,
        can_draft: bool,
        can_lookup: bool,
        control: DraftControl | None,
        reading: bool,
    ) -> Generator[Reading | Prefill | Round, None, None]:
        start = time.perf_counter()
        goal = seq[:-1]
        self._t_cache, self._t_tokens = self._reuse(
            self.target, self._t_cache, self._t_tokens, goal
        )
        reused = len(self._t_tokens)
        if reading and reused < len(goal):
            yield Reading(reused, len(seq), reused)
        # The cache's tokens are brought up to date after each chunk, so a reply
        # closed at a Reading leaves the caches as consistent as a stopped one.
        chunks = prefill_steps(
            self.target, self._t_cache, goal[reused:], PREFILL_STEP, self._stopped
        )
        chunk_start = time.perf_counter()
        for fed in chunks:
            if self.observer is not None:
                rows = reused + fed - len(self._t_tokens)
                self.observer(PrefillChunk(rows, 1, time.perf_counter() - chunk_start))
                chunk_start = time.perf_counter()
            self._t_tokens.extend(goal[len(self._t_tokens) : reused + fed])
            if reading and reused + fed < len(goal):
                yield Reading(reused + fed, len(seq), reused)
        if self._stopped():
            return

        def wanted() -> int | None:
            if not (can_draft or can_lookup):
                return 0
            return control.num_draft if control is not None else params.num_draft

        yield Prefill(len(seq), reused, time.perf_counter() - start)

        rounds = itertools.count()  # drafting rounds over the whole reply
        every = self.options.probe_every
        probe_first = every > 0 and self._step.value is None
        if wanted() != 0 and (probe_first or (can_draft and not self._draft_ready(seq))):
            # The first token comes at plain latency, before a probe's second
            # step or the draft's prefill.
            yield self._single_step(seq, params)
        while not self._stopped():
            if wanted() == 0:
                # Plain decoding until the control asks for drafting again.
                yield from self._plain(seq, params, until=lambda: wanted() != 0)
            # No token waits for the draft's prefill: while it catches up, a
            # chunk at a time, the target decodes plainly.
            if can_draft and wanted() != 0:
                yield from self._catch_up(seq, params)
                if self._stopped():
                    return
            yield from self._speculate_rounds(seq, params, can_draft, can_lookup, wanted, rounds)

    def _catch_up(
        self,
        seq: list[int],
        params: GenerationParams,
        lookup: PromptLookup | None = None,
        auto: bool = False,
    ) -> Generator[Round, None, float]:
        """Feeds the draft what it lacks, a chunk at a time, the target decoding plainly between.

        Ends once the draft can draft, or when the reply is cancelled. The plain
        steps between extend ``lookup`` and are marked ``auto`` as asked.

        Returns:
            The seconds spent feeding the draft.
        """
        spent = 0.0
        while not self._draft_ready(seq):
            start = time.perf_counter()
            self._feed_draft(seq)
            spent += time.perf_counter() - start
            if self._stopped():
                return spent
            if not self._draft_ready(seq):
                rnd = self._single_step(seq, params)
                if lookup is not None:
                    lookup.extend(list(rnd.tokens))
                yield replace(rnd, auto=auto)
        return spent

    def _draft_ready(self, seq: list[int]) -> bool:
        """Whether a round can draft now: the draft holds ``seq[:-1]`` but for a short tail.

        A draft ahead of ``seq`` (an edit, or a regenerated reply) is cut back to
        the common prefix first.
        """
        goal = seq[:-1]
        self._d_cache, self._d_tokens = _cut_back(self._d_cache, self._d_tokens, goal)
        # A round's own first draft step feeds the few tokens it lags after a round.
        return self._d_cache is not None and len(goal) - len(self._d_tokens) <= ROUND_LAG

    def _feed_draft(self, seq: list[int], limit: int | None = CATCH_UP_STEP) -> None:
        """Feeds the draft up to ``limit`` more tokens of ``seq[:-1]`` (all without one)."""
        assert self.draft is not None
        self._d_cache, self._d_tokens, _ = self._prepare(
            self.draft, self._d_cache, self._d_tokens, seq[:-1], limit=limit
        )

    def _speculate_rounds(
        self,
        seq: list[int],
        params: GenerationParams,
        can_draft: bool,
        can_lookup: bool,
        wanted: Callable[[], int | None],
        rounds: Iterator[int],
    ) -> Generator[Round, None, None]:
        """Drafting rounds until the wanted draft length becomes 0."""
        lookup = PromptLookup() if can_lookup else None
        if lookup is not None:
            lookup.reset(seq)
        last: tuple[Round, float] | None = None  # the previous drafting round and its start
        # Where the next round starts along a stretch of accepted drafts, if kept.
        fresh = FRESH if self.options.stretch else None
        belief = fresh
        after_plain: list[Plan] = []  # the plan that ended a plain stretch, not yet run
        while (num_draft := wanted()) != 0 and not self._stopped():
            started = time.perf_counter()
            if last is not None:
                # Start to start: what the round cost, reading it included.
                self.costs.observe_round(last[0].k, last[0].width, started - last[1])
                last = None
            n_round = next(rounds)
            lengths = self.draft_length(params, num_draft)
            if after_plain:
                plan = after_plain.pop()  # told already, when the plain stretch chose it
            else:
                plan = self._planned(lengths.choose(belief), auto=num_draft is None)
            if plan.k == 0:
                # Auto found that drafting does not pay: plain decoding for a while.
                stay = self._stays_plain(plan, lengths, fresh, wanted, num_draft, after_plain)
                for rnd in self._plain(seq, params, until=stay):
                    if lookup is not None:
                        lookup.extend(list(rnd.tokens))
                    yield replace(rnd, auto=True)
                belief = fresh  # plain tokens test no draft: where a stretch stands is unknown
                continue
            if can_draft and not self._draft_ready(seq):
                # Plain bursts leave the draft behind; it catches up only when a
                # round drafts (a try, say), not after every burst.
                # What switching back to drafting cost comes out of Auto's budget.
                lengths.charge((yield from self._catch_up(seq, params, lookup, num_draft is None)))
                if self._stopped():
                    return
                started = time.perf_counter()
            proposed = lookup.propose(plan.k) if lookup is not None else []
            # Measure plain decoding (a warm-up probe, then one that counts), then
            # refresh it now and then.
            first = self._step.value is None
            every = self.options.probe_every
            probe = every > 0 and (first or n_round % every == every - 1)
            if probe or (not proposed and not can_draft):
                new = tuple(self._plain_steps(seq, params))
                step = self._step.value or 0.0
                rnd = _target_round(new, step)
                belief = fresh
            else:
                spoken = self._speculate(
                    seq,
                    params,
                    proposed,
                    plan,
                    plan.k if can_draft else 0,
                    n_round,
                    cut=self._cuts(params, auto=num_draft is None),
                )
                if spoken is None:
                    return  # cancelled before verifying
                rnd = spoken
                if self.observer is not None:
                    run = RoundRun(
                        ks=(rnd.k,),
                        accepted=(rnd.accepted,),
                        auto=num_draft is None,
                        timed=rnd.timed,
                        stacked=False,
                        priced=None,
                        seconds=rnd.seconds,
                    )
                    self.observer(run)
                belief = lengths.observe(rnd.k, rnd.accepted, belief)
                if rnd.k and not proposed and not rnd.timed:  # lookup rounds cost no draft steps
                    last = (rnd, started)
                if num_draft is None:
                    rnd = replace(rnd, auto=True)
            seq += rnd.tokens
            if lookup is not None:
                lookup.extend(list(rnd.tokens))
            yield rnd

    def _stays_plain(
        self,
        plan: Plan,
        lengths: DraftLength,
        fresh: Belief | None,
        wanted: Callable[[], int | None],
        num_draft: int | None,
        after: list[Plan],
    ) -> Callable[[], bool]:
        """When a stretch of Auto's plain decoding ends: asked after each token.

        Each burst's end plans anew while the next plain step is already
        queued, so plain bursts follow one another without the device waiting
        (ending each burst unpipelined cost 8b:1b about 3 % on an H200). A
        plan that drafts ends the stretch and is kept in ``after`` for the
        round that runs it.
        """
        left = [max(1, round(plan.tokens))]

        def done() -> bool:
            left[0] -= 1
            if wanted() != num_draft or self._stopped():
                return True
            if left[0] > 0:
                return False
            nxt = self._planned(lengths.choose(fresh), auto=num_draft is None)
            if nxt.k == 0:
                left[0] = max(1, round(nxt.tokens))
                return False
            after.append(nxt)
            return True

        return done

    def _planned(self, plan: Plan, auto: bool) -> Plan:
        """``plan``, told the observer: planned by Auto, and a plain burst where it drafts none."""
        if self.observer is not None:
            if auto:
                self.observer(RoundPlanned((plan.k,), plan.tokens, plan.seconds, plan.explore))
            if plan.k == 0:
                self.observer(PlainBurst(max(1, round(plan.tokens))))
        return plan

    def _pick(
        self, logits: mx.array, params: GenerationParams, contexts: list[mx.array], position: int
    ) -> tuple[mx.array, mx.array | None]:
        return pick(logits, params, contexts, self._draws, position)

    @staticmethod
    def _history(seq: list[int], params: GenerationParams) -> mx.array:
        return penalty_history(seq, params)

    def _single_step(self, seq: list[int], params: GenerationParams) -> Round:
        """One plain target step, not pipelined: the next token as soon as possible."""
        assert self._t_cache is not None
        start = time.perf_counter()
        penal = params.repetition_penalty != 1.0
        history = self._history(seq[:-1], params)
        ctx = mx.concatenate([history, mx.array(seq[-1:], dtype=mx.int32)])
        y, _ = self._pick(
            _logits(self.target, mx.array(seq[-1:]), self._t_cache),
            params,
            [ctx[-params.repetition_context_size :]] if penal else [],
            len(seq),
        )
        t = _ints(y)[0]
        self._t_tokens.append(seq[-1])
        seq.append(t)
        seconds = time.perf_counter() - start
        return _target_round((t,), seconds)

    def _plain_steps(self, seq: list[int], params: GenerationParams) -> list[int]:
        """Two plain target steps, the second queued while the first runs.

        From the moment the first step's graph is built to the second result
        is what two tokens of pipelined plain decoding cost (the graph building
        of later steps overlaps the device); half of it is the baseline behind
        the reported speedup. Backends differ in when queued work runs, so only
        this span is timed, never the gap between the two results.
        """
        assert self._t_cache is not None
        penal = params.repetition_penalty != 1.0
        history = self._history(seq, params)
        y1, _ = self._pick(
            _logits(self.target, mx.array(seq[-1:]), self._t_cache),
            params,
            [history] if penal else [],
            len(seq),
        )
        built = time.perf_counter()
        mx.async_eval(y1)
        ctx = mx.concatenate([history, y1])[-params.repetition_context_size :]
        logits = _logits(self.target, y1, self._t_cache)
        y2, _ = self._pick(logits, params, [ctx] if penal else [], len(seq) + 1)
        mx.async_eval(y2)
        t1, t2 = _ints(y1)[0], _ints(y2)[0]
        step = PlainPace(built, steps=1).token(time.perf_counter())  # the second token's average
        self._step.add(step)
        self.costs.observe_step(step)
        self._t_tokens += [seq[-1], t1]
        return [t1, t2]

    def _plain(
        self,
        seq: list[int],
        params: GenerationParams,
        until: Callable[[], bool] | None = None,
        limit: int | None = None,
    ) -> Generator[Round, None, None]:
        """Plain decoding, one step ahead so the device never waits on Python.

        Returns once ``until()`` is true after a token, or after ``limit``
        tokens, leaving the target's cache holding ``seq[:-1]`` as a drafting
        round expects. A known ``limit`` queues no step past its last token.
        """
        assert self._t_cache is not None
        cache = self._t_cache

        penal = params.repetition_penalty != 1.0

        def step(token: mx.array, history: mx.array, position: int) -> mx.array:
            # history excludes token, the newest token of the sequence
            logits = _logits(self.target, token, cache)
            ctx = mx.concatenate([history, token])[-params.repetition_context_size :]
            return self._pick(logits, params, [ctx] if penal else [], position)[0]

        y = step(mx.array(seq[-1:], dtype=mx.int32), self._history(seq[:-1], params), len(seq))
        self._t_tokens.append(seq[-1])
        mx.async_eval(y)
        last = time.perf_counter()
        pace = PlainPace(last)
        for n in itertools.count(1):
            final = limit is not None and n >= limit
            if not final:
                next_y = step(y, self._history(seq, params), len(seq) + 1)
                mx.async_eval(next_y)
            t = _ints(y)[0]
            seq.append(t)
            now = time.perf_counter()
            seconds = pace.token(now)
            self._step.add(seconds)
            if pace.pipelined:  # what Auto weighs rounds against
                self.costs.observe_step(seconds)
            rnd = _target_round((t,), now - last)
            if final:
                yield rnd  # t was never fed: the cache holds seq[:-1]
                return
            self._t_tokens.append(t)  # fed to compute next_y
            yield rnd
            if until is not None and until():
                # next_y fed t to the cache; give it back, since a round feeds it.
                rewind(cache, 1)
                self._t_tokens.pop()
                return
            last = time.perf_counter()
            y = next_y

    def _draft_tokens(
        self,
        seq: list[int],
        params: GenerationParams,
        parts: list[mx.array],
        q_rows: list[mx.array | int],
        feed: list[int],
        n_draft: int,
        stop: float,
        timed: bool = False,
    ) -> tuple[int, float | None]:
        """Drafts up to ``n_draft`` tokens onto ``parts`` (and their rows onto ``q_rows``).

        With ``stop`` above 0 the draft ends once the product of its own
        probabilities of its tokens falls below it; each probability is read one
        step late, so the device keeps drafting while Python looks.

        Args:
            timed: Wait for the first step, so the steps after it time what
                one more draft token costs: the first also feeds the tokens
                the last round committed and starts from a synced device.

        Returns:
            Tokens drafted, and when the first step was done (``timed`` only).
        """
        assert self.draft is not None and self._d_cache is not None
        history = self._history(seq, params)
        penal = params.repetition_penalty != 1.0
        x = mx.array(feed, dtype=mx.int32)
        cutoff, ks = DraftCutoff([stop]), [n_draft]
        first_at = None
        for i in range(n_draft):
            if self._stopped():
                return i, first_at
            logits = _logits(self.draft, x, self._d_cache)[-1:]
            if self.vocab_size is not None:
                logits = fit_vocab(logits, self.vocab_size)
            ctx = []
            if penal:
                ctx = [mx.concatenate([history, *parts])[-params.repetition_context_size :]]
            position = len(seq) + sum(p.shape[0] for p in parts)
            token, probs = self._pick(logits, params, ctx, position)
            if probs is not None:
                q_rows.append(probs[0])
            x = token
            parts.append(token)
            if timed and i == 0:
                mx.eval(token)
                first_at = time.perf_counter()
            cutoff.note(0, token, probs, logits)
            mx.async_eval(x, cutoff.latest([0]))  # the device drafts while Python builds on
            cutoff.check(ks, i, [0])
            if ks[0] <= i + 1:
                return i + 1, first_at
        return n_draft, first_at

    def _speculate(
        self,
        seq: list[int],
        params: GenerationParams,
        looked_up: list[int],
        plan: Plan,
        k_draft: int,
        n_round: int,
        cut: bool = False,
    ) -> Round | None:
        """One round: draft, verify, accept, rewind (``None``: cancelled before verifying).

        ``cut``: the draft may end early where it is unsure (:meth:`_cuts`).
        """
        assert self._t_cache is not None
        start = time.perf_counter()
        missing = plan.width in self.costs.missing()
        drafts = k_draft > len(looked_up)
        timed = (
            missing
            or plan.explore
            or (drafts and (n_round % TIME_DRAFT_EVERY == 1 or not self.costs.draft_step))
        )
        proposal = self._propose(seq, params, looked_up, plan, k_draft, timed, cut)
        if self._stopped():
            self._drop_draft(proposal)
            return None
        width = plan.width
        if proposal.size < plan.k and not missing:  # a short draft may verify in fewer rows
            padded = self.costs.profile().padded_round(proposal.size + 1, keep=width)
            width = padded[1] if padded is not None else width
        verify_start, draft_seconds = self._time_draft(proposal, timed, start)
        verdict = self._verify(seq, params, proposal, width)
        if timed:
            self.costs.observe_verify(width, time.perf_counter() - verify_start, len(seq))
        self._rewind(seq, proposal, verdict, width)
        n = verdict.accepted
        origins = [Origin.LOOKUP if i < proposal.looked_up else Origin.DRAFT for i in range(n)]
        origins.append(Origin.BONUS if n == proposal.size else Origin.CORRECTION)
        return Round(
            tokens=(*verdict.proposed[:n], verdict.next_token),
            origins=tuple(origins),
            k=proposal.size,
            accepted=n,
            source=proposal.source,
            seconds=time.perf_counter() - start,
            draft_seconds=draft_seconds,
            width=width,
            timed=timed,
        )

    def _propose(
        self,
        seq: list[int],
        params: GenerationParams,
        looked_up: list[int],
        plan: Plan,
        k_draft: int,
        timed: bool = False,
        cut: bool = False,
    ) -> _Proposal:
        """Lookup's tokens, then up to ``k_draft`` in all from the draft (queued, not evaluated)."""
        parts: list[mx.array] = [mx.array(looked_up, dtype=mx.int32)] if looked_up else []
        q_rows: list[mx.array | int] = list(looked_up)  # an int stands for a one-hot row
        drafted = max(k_draft - len(looked_up), 0)
        fed: list[int] = []
        first_at = None
        if drafted:
            assert self.draft is not None and self._d_cache is not None
            fed = seq[len(self._d_tokens) :] + looked_up
            # Each more draft token must be worth its step at the round's rate.
            stop = stop_below(self.costs.draft_step, plan.rate) if cut else 0.0
            drafted, first_at = self._draft_tokens(
                seq, params, parts, q_rows, fed, drafted, stop, timed
            )
        filler = looked_up[-1] if looked_up else seq[-1]
        return _Proposal(
            tokens=mx.concatenate(parts) if parts else mx.array([], dtype=mx.int32),
            q_rows=q_rows,
            looked_up=len(looked_up),
            drafted=drafted,
            fed=fed,
            filler=filler,
            first_at=first_at,
        )

    def _time_draft(self, proposal: _Proposal, timed: bool, start: float) -> tuple[float, float]:
        """When verification starts, and the seconds of drafting (measured or estimated).

        A timed round waits for the draft before verifying, which splits the two
        costs; others keep the draft queued ahead of the verification. A draft
        step is priced by the steps after the first: what one more token costs.
        The first step's extra (the tokens it feeds, the start from a synced
        device) is then part of what the round costs at its width.
        """
        if timed:
            mx.eval(proposal.tokens)
            verify_start = time.perf_counter()
            if proposal.drafted > 1 and proposal.first_at is not None:
                later = (verify_start - proposal.first_at) / (proposal.drafted - 1)
                self.costs.observe_draft_step(later)
            elif proposal.drafted:
                self.costs.observe_draft_step((verify_start - start) / proposal.drafted)
            return verify_start, verify_start - start
        return start, (self.costs.draft_step or 0.0) * proposal.drafted

    def _verify(
        self, seq: list[int], params: GenerationParams, proposal: _Proposal, width: int
    ) -> Verdict:
        """One target forward over the proposal in ``width`` rows; what it accepts."""
        assert self._t_cache is not None
        k = proposal.size
        # Padding rows come after the real ones, so causal attention keeps them
        # out of every logit that is read; the cache gives them back on rewind.
        rows = [mx.array(seq[-1:], dtype=mx.int32), proposal.tokens]
        if width > k + 1:
            rows.append(mx.array([proposal.filler] * (width - k - 1), dtype=mx.int32))
        logits = _logits(self.target, mx.concatenate(rows), self._t_cache)[: k + 1]
        return judge(logits, seq, params, proposal.tokens, proposal.q_rows, self._draws)

    def _drop_draft(self, proposal: _Proposal) -> None:
        """Gives back what drafting added to the draft's cache (nothing was verified)."""
        if proposal.drafted:
            assert self._d_cache is not None
            # Its first step fed ``fed``; each later step one drafted token.
            if not rewind(self._d_cache, len(proposal.fed) + proposal.drafted - 1):
                self._d_cache, self._d_tokens = None, []  # past a window's slack: read again

    def _rewind(self, seq: list[int], proposal: _Proposal, verdict: Verdict, width: int) -> None:
        """Gives back the cache rows of rejected and padding tokens, in both models."""
        assert self._t_cache is not None
        n = verdict.accepted
        rewind(self._t_cache, width - 1 - n)  # at most a round's rows: within any slack
        self._t_tokens += [seq[-1], *verdict.proposed[:n]]
        if not proposal.drafted:
            return
        assert self._d_cache is not None
        # The draft's cache holds what it was fed and all but its last draft token.
        held = self._d_tokens + proposal.fed
        drafted = verdict.proposed[proposal.looked_up : proposal.size - 1]
        committed = [*seq, *verdict.proposed[:n], verdict.next_token]
        keep = draft_kept(held, drafted, committed)
        if rewind(self._d_cache, len(held) + len(drafted) - keep):
            self._d_tokens = (held + drafted)[:keep]
        else:  # past a window's slack: read again
            self._d_cache, self._d_tokens = None, []
