"""Speculative decoding for several requests at once, their target forwards shared.

Each round drafts for every open request (the draft's steps shared across
the requests that draft: packed, or with their caches side by side where the
batch measures that faster, :mod:`app.engine.stacked`) and then verifies all
proposals in one packed target forward
(:func:`app.engine.packed.packed_forward`): the projections and the MLP see
every request's rows as one matrix. Each request then keeps its own accepted
prefix by the one rule of :func:`app.engine.speculative.judge`, so greedy
replies are token for token what they are alone and sampling stays lossless.

Ragged acceptance costs no copies per round. While the same requests run,
their target caches are kept side by side (:mod:`app.engine.side_by_side`):
rejected rows masked in place, one attention call a layer, shapes that do not
change from round to round; each request gets its own per-layer KV cache
(mlx-lm's ``KVCache``) back when the batch's members change. That layout
measured faster than each request attending over its own cache on CUDA and on
this CPU (run 20 in docs/benchmarks-history.md); ``EngineOptions.side_by_side`` off keeps each
cache apart, rejected rows trimmed and RoPE at each cache's own offset.
A request joins between rounds; the
prompts of joining requests are read :data:`PREFILL_CHUNK` tokens per round
in all, so a long prompt delays the others by at most one chunk's forward per
round. While no request decodes, nobody waits on a read, so it takes up to
:data:`IDLE_READ` tokens in all (still at most a chunk of each prompt): requests
that come together start together, rather than the first chunk's requests
running a round of their own and, at their end, another without the rest. The caches of the
last :data:`KEEP` finished requests stay, so a follow-up turn reads only what
they did not hold. Requests that share the start of their prompts (a team's
system prompt, one conversation regenerated) read it once: a joining request
copies the rows another open request holds (:data:`SHARE_MIN`), or a kept one
holds, rather than reading them. A lone request that drafts nothing (drafting
off, or Auto finding that it does not pay) decodes plainly with a step queued
ahead, as the single decoder does, until another request opens or it asks for
drafting.

:meth:`BatchDecoder.generate` has :class:`~app.engine.speculative.Decoder`'s
signature, so :func:`app.engine.generate.stream_reply` drives one request of a
batch as it drives a lone one. Pulling a request whose next round has not run
yet runs a round for every request waiting likewise: consumers that take turns
(one thread, round robin) thereby share each round.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from app.engine import attention
from app.engine.adaptive import Acceptance, DraftLength
from app.engine.batch_costs import BatchCosts, BatchLength, Want, shape
from app.engine.caches import new_cache, rewind
from app.engine.costs import K_MAX, CostModel, PlainPace, expected_tokens
from app.engine.observe import Observer, PlainBurst, PrefillChunk, RoundPlanned, RoundRun
from app.engine.options import DEFAULT_OPTIONS, EngineOptions
from app.engine.packed import packable, packed_forward
from app.engine.sampling import Draws
from app.engine.side_by_side import SideBySide
from app.engine.speculative import (
    DraftControl,
    DraftCutoff,
    Prefill,
    Round,
    Verdict,
    check_drafting,
    common_prefix,
    draft_cuts,
    draft_kept,
    fit_vocab,
    judge,
    penalty_history,
    pick,
    prepare,
    stop_below,
)
from app.engine.stacked import Stack, stackable, stacked_step
from app.engine.stretch import FRESH, Belief
from app.engine.types import GenerationParams, Origin, Reading

PREFILL_CHUNK = 512  # prompt tokens one round reads for joining requests, in all
IDLE_READ = 4 * PREFILL_CHUNK  # the same while no request decodes (a chunk of each prompt at most)
STACK_FIRST = 4  # tokens a request's first draft step may feed for that step to run stacked
KEEP = 4  # finished requests whose caches are kept for a follow-up that shares their prefix
PROBE = 2  # plain tokens of a lone Auto request's probe: the second one's step is pipelined
# Fewest prompt rows a joining request copies from another open request's caches rather than
# reading them: a copy costs next to nothing, a read its share of a forward.
SHARE_MIN = 32


@dataclass(eq=False)
class _Request:
    """One open request: its sequence, both caches and what it has yet to hand over."""

    seq: list[int]
    params: GenerationParams
    control: DraftControl | None
    cancel: threading.Event | None
    t_cache: list[Any]
    d_cache: list[Any] | None  # None: no draft, or a target whose cache cannot be rewound
    started: float = field(default_factory=time.perf_counter)
    read: int = 0  # prompt tokens the target holds
    reused: int = 0  # of those, tokens a finished request's caches held already
    announced: bool = False  # its Prefill is out: it takes part in rounds
    # Its own random draws: no other request's changes its reply.
    draws: Draws = field(default_factory=lambda: Draws(None))
    prompt: int = 0  # tokens of the prompt
    d_tokens: list[int] = field(default_factory=list)  # what the draft's cache holds
    out: deque[Prefill | Round] = field(default_factory=deque)
    # Where its next round starts along a stretch of accepted drafts: a lone
    # request's Auto plans along stretches, as the single decoder's does.
    belief: Belief = FRESH

    @property
    def reading(self) -> bool:
        return self.read < self.prompt - 1

    @property
    def generated(self) -> int:
        return len(self.seq) - self.prompt

    @property
    def left(self) -> int:
        """Tokens it may still commit within its budget."""
        return self.params.max_tokens - self.generated

    @property
    def stopped(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def num_draft(self) -> int | None:
        return self.control.num_draft if self.control is not None else self.params.num_draft


@dataclass(frozen=True, slots=True)
class _Kept:
    """A finished request's caches and what they hold, for a follow-up turn."""

    tokens: list[int]  # what the target's cache holds
    t_cache: list[Any]
    d_tokens: list[int]
    d_cache: list[Any] | None


@dataclass
class _Burst:
    """A lone request's plain decoding, one step queued ahead of the token handed out.

    While it runs, the request's target cache holds all of its sequence:
    ``queued`` was computed by feeding the sequence's newest token.
    """

    request: _Request
    queued: mx.array  # the next token, evaluating
    left: int  # tokens the burst may still hand out, the queued one included
    wanted: int | None  # the request's draft setting when the burst began
    pace: PlainPace  # its steps' average cost
    last: float  # when the previous token was handed out (or the burst began)


@dataclass(frozen=True, slots=True)
class BatchStats:
    """What the batch has done since it was made, for ``/metrics``.

    Attributes:
        active: Requests open now.
        rounds: Batched rounds run.
        drafted: Tokens proposed across requests.
        accepted: Of those, tokens the target kept.
        tokens: Tokens committed across requests.
        largest: Most requests one round verified together.
        shared: Prompt tokens a request copied from another's caches rather than read.
    """

    active: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    largest: int = 0
    shared: int = 0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


class BatchDecoder:
    """Runs the rounds of every open request together, on the thread that owns the models.

    A round of one request plans as that request would alone; a round of
    several, where any is on Auto, plans for the batch's tokens per second from
    the batch's own costs (:mod:`app.engine.batch_costs`), which its rounds measure.

    Args:
        target: The model whose output every request gets.
        draft: The model that proposes tokens, if any.
        costs: The pair's measured costs, which a lone request's Auto plans with.
        batch_costs: The pair's batched-round costs; by default learned afresh.
        acceptance: The pair's running acceptance by sampling (``True``: T > 0),
            shared with its single-request decoder; by default the batch's own.
        options: How it runs (:class:`~app.engine.options.EngineOptions`).
    """

    def __init__(
        self,
        target: nn.Module,
        draft: nn.Module | None = None,
        costs: CostModel | None = None,
        batch_costs: BatchCosts | None = None,
        acceptance: Callable[[bool], Acceptance] | None = None,
        options: EngineOptions = DEFAULT_OPTIONS,
    ) -> None:
        self.target = target
        self.options = options
        # The target's caches of the requests last verified together, side by side.
        self._side: tuple[list[_Request], SideBySide] | None = None
        self.draft = draft
        self.costs = costs if costs is not None else CostModel()
        self.batch_costs = batch_costs if batch_costs is not None else BatchCosts(self.costs)
        self._planner = BatchLength(self.batch_costs)
        self._planner.stretch = options.stretch
        self.batch_costs.can_stack = draft is not None and stackable(draft)
        # The last round's shape and start, to time it to the next round's start.
        self._last: tuple[tuple[int, int, int, int], float] | None = None
        self.vocab_size: int | None = getattr(getattr(target, "args", None), "vocab_size", None)
        own: dict[bool, Acceptance] = {}
        self._acceptance = acceptance or (lambda sampling: own.setdefault(sampling, Acceptance()))
        self._lengths: dict[tuple[int, int | None, bool], DraftLength] = {}
        self._open: list[_Request] = []
        self._burst: _Burst | None = None  # a lone request decoding plainly, pipelined
        self._lone = 0  # rounds a lone Auto request planned, for its probes
        self._kept: list[_Kept] = []  # newest last
        self._rounds = self._drafted = self._accepted = self._tokens = self._largest = 0
        self._shared = 0
        # Learned on the first request, so that making a batch costs nothing until it decodes.
        self._trimmable: bool | None = None
        self.observer: Observer | None = None  # told what each round planned and cost
        # Whether the pair's caches are plain KV caches, whose rows can be copied; learned
        # on the first request, as every request's caches are made alike.
        self._copies: bool | None = None

    @property
    def active(self) -> int:
        """Requests open now."""
        return len(self._open)

    @property
    def baseline_tps(self) -> float | None:
        """Plain decoding speed of the target alone, from the pair's profile."""
        verify = self.costs.profile().verify
        return 1.0 / verify[0] if verify and verify[0] else None

    def stats(self) -> BatchStats:
        """A snapshot of the batch's totals."""
        return BatchStats(
            self.active,
            self._rounds,
            self._drafted,
            self._accepted,
            self._tokens,
            self._largest,
            self._shared,
        )

    def generate(
        self,
        prompt: Sequence[int],
        params: GenerationParams,
        control: DraftControl | None = None,
        cancel: threading.Event | None = None,
        reading: bool = False,
    ) -> Generator[Reading | Prefill | Round, None, None]:
        """Opens a request; its generator yields a :class:`Prefill`, then rounds until ``cancel``.

        The request joins the batch at once. The caller stops pulling on end
        of sequence or length; closing the generator, or setting ``cancel``,
        takes the request out of the batch. ``reading`` is accepted
        for :class:`~app.engine.speculative.Decoder`'s signature; a batched
        request's prompt is read between rounds and reported by its Prefill.

        Raises:
            CacheError: Drafting was asked of a target whose cache cannot be rewound.
        """
        if len(prompt) < 1:
            raise ValueError("a prompt needs at least one token")
        self.options.apply()  # this batch's paths from this request on
        if self._trimmable is None:
            self._trimmable = prepare(self.target, self.draft)
        wanted = control.num_draft if control is not None else params.num_draft
        check_drafting(self._trimmable, self.draft is not None, wanted)
        drafts = self.draft is not None and self._trimmable
        request = _Request(
            seq=list(prompt),
            prompt=len(prompt),
            params=params,
            control=control,
            cancel=cancel,
            t_cache=new_cache(self.target),
            d_cache=new_cache(self.draft) if drafts and self.draft is not None else None,
        )
        request.draws = Draws(params.seed)
        if self._copies is None:
            self._copies = _copyable(request.t_cache, request.d_cache)
        self._reuse(request)
        self._open.append(request)  # now, so that it joins the next round even unpulled
        return _Stream(self._stream(request), lambda: self._leave(request))

    def forget(self) -> int:
        """Drops the caches kept from finished requests; returns the bytes they held."""
        held = sum(
            getattr(c, "nbytes", 0) for k in self._kept for c in (*k.t_cache, *(k.d_cache or ()))
        )
        self._kept.clear()
        return held

    def _stream(self, request: _Request) -> Generator[Prefill | Round, None, None]:
        whole = False
        try:
            while not request.stopped:
                if request.out:
                    yield request.out.popleft()
                else:
                    self.step()
            whole = True
        except GeneratorExit:
            whole = True  # closed between rounds: the caches hold what was committed
            raise
        finally:
            self._leave(request, keep=whole)

    def _leave(self, request: _Request, keep: bool = True) -> None:
        """Takes ``request`` out; its caches are kept for a follow-up when they can be cut back."""
        if request not in self._open:
            return
        if self._burst is not None and self._burst.request is request:
            # Its queued step fed its newest token: given back, as a round would not feed it.
            rewind(request.t_cache, 1)
            self._burst = None
        if self._side is not None and request in self._side[0]:
            self._unstack()  # its own cache back before it is kept
        self._open.remove(request)
        if keep and self._trimmable and request.read:
            held = request.seq[: request.read] if request.reading else request.seq[:-1]
            kept = _Kept(held, request.t_cache, request.d_tokens, request.d_cache)
            self._kept = [*self._kept, kept][-KEEP:]

    def _reuse(self, request: _Request) -> None:
        """Starts ``request`` from the kept caches that share the longest prefix with its prompt.

        A follow-up turn then reads only what is new, as the single-request
        decoder does across turns: it takes the caches over. A prompt that
        shares only part of what they hold (another conversation with the same
        system prompt, a regenerated reply) copies those rows instead, so the
        finished conversation keeps its caches for its own follow-up.
        """
        goal = request.seq[:-1]

        def shared(k: _Kept) -> int:
            n = common_prefix(k.tokens, goal)
            if request.d_cache is not None:
                n = min(n, common_prefix(k.d_tokens, goal)) if k.d_cache is not None else 0
            return n

        best = max(self._kept, key=shared, default=None)
        n = shared(best) if best is not None else 0
        if best is None or n == 0:
            return
        if n < len(best.tokens) and self._copies:
            self._copy_into(request, _front(best.t_cache, n), best.d_cache, n)
            return
        self._kept.remove(best)
        if not rewind(best.t_cache, len(best.tokens) - n):
            return  # a window cannot go back that far: read the prompt anew
        request.t_cache, request.read, request.reused = best.t_cache, n, n
        d_cache = best.d_cache if request.d_cache is not None else None
        if d_cache is not None and rewind(d_cache, len(best.d_tokens) - n):
            request.d_cache, request.d_tokens = best.d_cache, goal[:n]

    def _length(self, params: GenerationParams, num_draft: int | None) -> DraftLength:
        """The controller of a setting, shared by the requests of that setting."""
        sampling = params.temperature > 0
        key = (params.k_max, num_draft, sampling)
        if key not in self._lengths:
            accept = self._acceptance(sampling)
            self._lengths[key] = DraftLength(params.k_max, num_draft, self.costs, accept)
        return self._lengths[key]

    def step(self) -> None:
        """One round for every open request that waits for one.

        Joining requests read their prompts first, :data:`PREFILL_CHUNK`
        tokens in all (:data:`IDLE_READ` while none decodes), oldest first, in
        one packed forward per model.
        """
        for gone in [r for r in self._open if r.stopped]:
            self._leave(gone)  # cancelled, perhaps before it was ever pulled
        if self._burst is not None:
            burst = self._burst
            if len(self._open) > 1 or burst.request.num_draft() != burst.wanted:
                self._hand_out(burst, go_on=False)  # another joined, or drafting was asked for
            elif not burst.request.out:
                self._hand_out(burst, go_on=burst.left > 1)
                return
        waiting = [r for r in self._open if not r.out]
        ready = [r for r in waiting if r.announced]
        joining = [r for r in waiting if not r.announced]
        reading = [r for r in joining if r.reading]
        if reading:
            self._read(reading)
        for r in joining:
            if not r.reading:
                r.out.append(Prefill(len(r.seq), r.reused, time.perf_counter() - r.started))
                r.announced = True
        if ready:
            self._round(ready)

    def _read(self, joining: list[_Request]) -> None:
        """Reads the next chunks of joining requests' prompts into both models' caches.

        A request whose prompt starts as another open request's copies those
        rows instead (:meth:`_share`), waiting where the other reads them in
        the same forward; what it has left is read in a second forward,
        within the same budget.
        """
        left = PREFILL_CHUNK if any(r.announced for r in self._open) else IDLE_READ
        self._last = None  # the next round's period would hold this reading
        waiting = joining
        while True:
            self._share(joining)
            waiting = [r for r in waiting if r.reading]
            if not waiting or left <= 0:
                return
            chunks, waiting = self._chunks(waiting, left)
            left -= sum(len(c) + attention.padding(len(c), r.t_cache) for r, c in chunks)
            self._read_chunks(chunks)

    def _chunks(
        self, joining: list[_Request], left: int
    ) -> tuple[list[tuple[_Request, list[int]]], list[_Request]]:
        """One forward's prompt chunks within ``left`` rows, oldest first, and the requests
        that wait for it to copy what it reads."""
        chunks: list[tuple[_Request, list[int]]] = []
        follow: list[_Request] = []
        for r in joining:
            if left <= 0:
                break
            if any(self._gain(r, s, s.read + len(c)) for s, c in chunks):
                follow.append(r)
                continue
            chunk = r.seq[r.read : min(r.prompt - 1, r.read + min(left, PREFILL_CHUNK))]
            chunks.append((r, chunk))
            left -= len(chunk) + attention.padding(len(chunk), r.t_cache)
        return chunks, follow

    def _gain(self, request: _Request, source: _Request, held: int | None = None) -> int:
        """Prompt rows ``request`` would gain by copying ``source``'s, where at least
        :data:`SHARE_MIN` (else 0).

        Args:
            held: The rows ``source`` will hold once read (by default those it
                holds now): a joining request's read rows, a decoding one's prompt.
        """
        if not self.options.share_prompts or source is request or not self._copies:
            return 0
        goal = request.seq[: request.prompt - 1]
        if held is None:
            held = source.prompt - 1 if source.announced else source.read
        n = common_prefix(source.seq[:held], goal)
        if request.d_cache is not None:
            if source.d_cache is None:
                return 0
            if source.announced:  # a joining request's draft holds what its target does
                n = min(n, common_prefix(source.d_tokens, goal))
        gain = n - request.read
        return gain if gain >= SHARE_MIN else 0

    def _share(self, joining: list[_Request]) -> None:
        """Each reading request copies the prompt rows another open request holds of it.

        A prompt's rows are the first of its caches in any layout: a joining
        request's own, a decoding one's own or side by side with others
        (:meth:`SideBySide.front`), so a copy of them is what reading them
        would leave.
        """
        for r in joining:
            if not r.reading:
                continue
            gain, best = max(((self._gain(r, s), s) for s in self._open), key=lambda g: g[0])
            if not gain:
                continue
            n = r.read + gain
            if self._side is not None and best in self._side[0]:
                rows = self._side[1].front(self._side[0].index(best), n)
            else:
                rows = _front(best.t_cache, n)
            self._copy_into(r, rows, best.d_cache, n)

    def _copy_into(
        self,
        request: _Request,
        rows: list[tuple[mx.array, mx.array]],
        d_cache: list[Any] | None,
        n: int,
    ) -> None:
        """Gives ``request`` new caches of the first ``n`` rows of its prompt: the target's
        ``rows``, the draft's copied from ``d_cache`` (a draft's caches are always its own)."""
        request.t_cache = _copied(rows)
        if request.d_cache is not None and d_cache is not None:
            request.d_cache, request.d_tokens = _copied(_front(d_cache, n)), request.seq[:n]
        self._shared += n - request.read
        request.reused += n - request.read
        request.read = n
        # Now, so that no lazy slice keeps a whole stack or cache it was cut from.
        mx.eval([c.state for c in (*request.t_cache, *(request.d_cache or ()))])

    def _read_chunks(self, chunks: list[tuple[_Request, list[int]]]) -> None:
        """One forward per model of ``chunks`` into their requests' caches."""
        start = time.perf_counter()
        states = self._read_into(self.target, chunks, [r.t_cache for r, _ in chunks])
        drafting = [(r, c) for r, c in chunks if r.d_cache is not None]
        if drafting and self.draft is not None:
            caches = [c for r, _ in drafting if (c := r.d_cache) is not None]
            states += self._read_into(self.draft, drafting, caches)
        mx.eval(states)
        if self.observer is not None:
            rows = sum(len(c) for _, c in chunks)
            self.observer(PrefillChunk(rows, len(chunks), time.perf_counter() - start))
        for r, chunk in chunks:
            r.read += len(chunk)
            if r.d_cache is not None:
                r.d_tokens += chunk

    def _read_into(
        self, model: nn.Module, chunks: list[tuple[_Request, list[int]]], caches: list[list[Any]]
    ) -> list[mx.array]:
        """One forward of prompt chunks into ``caches``, each padded and cut back.

        Only the caches' states are returned to evaluate: no logits of the
        prompts are computed. The padding (:func:`attention.padding`) keeps
        the reads' shapes few on backends that build kernels per shape.
        """
        reads = [attention.padded(c, cache) for (_, c), cache in zip(chunks, caches, strict=True)]
        self._forward(model, [mx.array(rows, dtype=mx.int32) for rows, _ in reads], caches)
        for cache, (_, pad) in zip(caches, reads, strict=True):
            if pad:
                rewind(cache, pad)  # the pad's rows are read for their shape only
        return [c.state for cache in caches for c in cache]

    def _room(self, request: _Request) -> int:
        """The most ``request`` may draft this round: never past its budget or its k_max."""
        room = request.left - 1
        return max(0, min(room, request.params.k_max, K_MAX))

    def _own(self, request: _Request) -> tuple[int, int]:
        """Tokens ``request`` drafts this round by its own setting, as it would alone.

        Returns:
            That k, and where it is 0, how many tokens it decodes plainly before
            its setting plans again (the rest of its budget where it does not draft).
        """
        wanted = request.num_draft()
        left = request.left
        if request.d_cache is None or wanted == 0:
            return 0, left
        plan = self._length(request.params, wanted).choose(
            request.belief if self.options.stretch else None
        )
        k = min(plan.k, self._room(request))
        return k, 0 if k else min(max(1, round(plan.tokens)), left)

    def _want(self, request: _Request) -> Want:
        """What ``request`` allows the batch's plan: its room, and its own k unless on Auto."""
        wanted = request.num_draft()
        if request.d_cache is None or wanted == 0:
            return Want(self._acceptance(request.params.temperature > 0), 0, 0)
        length = self._length(request.params, wanted)
        fixed = None if wanted is None else length.choose().k
        return Want(length.acceptance, self._room(request), fixed)

    def _plan(self, requests: list[_Request]) -> tuple[list[int], bool, int]:
        """Each request's draft length this round, whether the round is timed part by part,
        and for a lone request that drafts nothing, the tokens it may decode plainly.

        Several requests of which any is on Auto plan together, for the
        batch's tokens per second; otherwise each plans by its own setting.
        """
        if len(requests) > 1 and any(
            r.d_cache is not None and r.num_draft() is None for r in requests
        ):
            plan = self._planner.choose([self._want(r) for r in requests])
            if self.observer is not None:
                self.observer(RoundPlanned(plan.ks, plan.tokens, plan.seconds, plan.explore))
            return list(plan.ks), plan.timed, 0
        if len(requests) == 1 and self._probes(requests[0]):
            return [0], False, PROBE
        own = [self._own(r) for r in requests]
        ks = [k for k, _ in own]
        b, m, _, drafting = shape(ks)
        plain = own[0][1] if len(own) == 1 else 0
        return ks, self.batch_costs.wants_timing(b, m, drafting), plain

    def _probes(self, request: _Request) -> bool:
        """Whether a lone Auto request's round is :data:`PROBE` plain tokens instead.

        They time a pipelined plain step, which Auto prices plain decoding at,
        on its first round and every ``options.probe_every`` after, as the single
        decoder probes. Without them a batch whose pair decodes plainly nowhere
        else prices it at a lone forward, and Auto keeps drafting where plain
        decoding is faster. Only once every width's cost is known: the batch
        does not time a lone request's rounds, and a profile that knew the
        plain step alone would price every verification at it.
        """
        if request.num_draft() is not None or request.d_cache is None or not self.costs.complete:
            return False
        self._lone += 1
        every = self.options.probe_every
        return every > 0 and (self._lone - 1) % every == 0 and request.left >= PROBE

    def _stops(self, requests: list[_Request], ks: list[int]) -> list[float]:
        """Per request, the chance of its draft so far below which its draft ends (0: never).

        As alone (:func:`app.engine.speculative.stop_below`), one more token
        must be worth its step at the round's expected rate; a request's share
        of a step is the step over the requests it drafts for.
        """
        cuts = [
            k > 0 and draft_cuts(r.params, r.num_draft() is None, self.options.draft_cutoff)
            for r, k in zip(requests, ks, strict=True)
        ]
        b, m, steps, d = shape(ks)
        seconds = self.batch_costs.round_seconds(b, m, steps, d) if any(cuts) else None
        step = self.batch_costs.draft_step(d) if seconds else None
        if not seconds or not step:
            return [0.0] * len(ks)
        tokens = sum(
            expected_tokens(self._length(r.params, r.num_draft()).acceptance.rates(), k)
            if k
            else 1.0
            for r, k in zip(requests, ks, strict=True)
        )
        stop = stop_below(step / d, tokens / seconds)
        return [stop if cut else 0.0 for cut in cuts]

    def _round(self, requests: list[_Request]) -> None:
        """Drafts for ``requests``, verifies them all in one forward, commits each."""
        start = time.perf_counter()
        if self._last is not None:
            self.batch_costs.observe_round(*self._last[0], start - self._last[1])
        ks, timed, plain = self._plan(requests)
        if plain > 1 and len(self._open) == 1:
            self._begin_plain(requests[0], plain)
            return
        stacked = self.batch_costs.stacks(shape(ks)[3])
        cutoff = DraftCutoff(self._stops(requests, ks))
        proposals, q_rows, fed, first, stacked = self._draft(requests, ks, timed, stacked, cutoff)
        if timed:
            mx.eval(proposals)  # the draft's time apart from the verification's
        draft_end = time.perf_counter()
        rows: list[mx.array] = [
            mx.concatenate([mx.array(r.seq[-1:], dtype=mx.int32), p])
            if k
            else mx.array(r.seq[-1:], dtype=mx.int32)
            for r, k, p in zip(requests, ks, proposals, strict=True)
        ]
        logits, side = self._verify(requests, rows)
        round_shape = shape(ks)
        if timed:
            mx.eval(logits)
            verify = time.perf_counter() - draft_end
            first_step = first - start if first is not None else None
            self.batch_costs.observe_parts(
                *round_shape, draft_end - start, verify, first_step, stacked
            )
        self._last = None if timed else (round_shape, start)
        verdicts = [
            self._judge(r, k, lg[0].astype(mx.float32), p, q)
            for r, k, lg, p, q in zip(requests, ks, logits, proposals, q_rows, strict=True)
        ]
        if side is not None:
            side.settle([v.accepted + 1 for v in verdicts])
        seconds = time.perf_counter() - start
        draft_seconds = (draft_end - start) if any(ks) else 0.0
        self._rounds += 1
        self._largest = max(self._largest, len(requests))
        shares = self._shares(requests, ks)
        for r, k, v, f, share in zip(requests, ks, verdicts, fed, shares, strict=True):
            self._commit(r, k, v, f, share, trim=side is None)
            n = v.accepted
            self._drafted, self._accepted, self._tokens = (
                self._drafted + k,
                self._accepted + n,
                self._tokens + n + 1,
            )
            r.out.append(
                Round(
                    tokens=(*v.proposed[:n], v.next_token),
                    origins=(*([Origin.DRAFT] * n), _last_origin(k, n)),
                    k=k,
                    accepted=n,
                    source="draft" if k else "none",
                    seconds=seconds,
                    draft_seconds=draft_seconds if k else 0.0,
                    auto=r.num_draft() is None and k > 0,
                    width=k + 1,
                )
            )
        if self.observer is not None:
            priced = self.batch_costs.round_seconds(*round_shape) if len(ks) > 1 else None
            run = RoundRun(
                ks=tuple(ks),
                accepted=tuple(v.accepted for v in verdicts),
                auto=any(r.num_draft() is None for r in requests),
                timed=timed,
                stacked=stacked,
                priced=priced,
                seconds=time.perf_counter() - start,  # its commit included
            )
            self.observer(run)

    def _begin_plain(self, request: _Request, tokens: int) -> None:
        """Plain decoding of the lone ``request`` for up to ``tokens`` tokens, pipelined.

        One step stays queued ahead of the token handed out, as the single
        decoder's plain decoding does (:meth:`Decoder._plain`): a round a
        token would wait on Python between steps. Each token is drawn as a
        round of no draft draws it (:meth:`_pick_plain`), so replies do not
        change. :meth:`step` ends the burst once another request opens or the
        request asks for drafting, handing out the queued token first.
        """
        self._last = None  # the next round's period would hold these steps
        token = mx.array(request.seq[-1:], dtype=mx.int32)
        queued = self._plain_next(request, token, request.seq[:-1])
        now = time.perf_counter()
        self._burst = _Burst(request, queued, tokens, request.num_draft(), PlainPace(now), now)
        if self.observer is not None:
            self.observer(PlainBurst(tokens))
        self._hand_out(self._burst, go_on=tokens > 1)

    def _plain_next(self, request: _Request, token: mx.array, before: Sequence[int]) -> mx.array:
        """The token after ``token`` (lazy), fed to the target's cache; ``before`` precedes it."""
        logits = self._forward(self.target, [token], [request.t_cache])[0][0]
        history = None
        if request.params.repetition_penalty != 1.0:
            size = request.params.repetition_context_size
            history = mx.concatenate([penalty_history(before, request.params), token])[-size:]
        out = self._pick_plain(request, logits.astype(mx.float32), history, len(before) + 1)
        mx.async_eval(out)
        return out

    def _pick_plain(
        self, request: _Request, logits: mx.array, history: mx.array | None, position: int
    ) -> mx.array:
        """The token a round of no draft commits: ``history`` is what the penalty looks at."""
        contexts = [history] if history is not None else []
        token, _ = pick(logits, request.params, contexts, request.draws, position)
        return token

    def _hand_out(self, burst: _Burst, go_on: bool) -> None:
        """Hands out the burst's queued token, the next step queued first where it goes on."""
        r = burst.request
        after = None
        if go_on:
            after = self._plain_next(r, burst.queued.reshape(-1).astype(mx.int32), r.seq)
        t = cast(int, burst.queued.item())
        now = time.perf_counter()
        step = burst.pace.token(now)
        if burst.pace.pipelined and self.costs.complete:
            self.costs.observe_step(step)
        r.seq.append(t)
        self._rounds, self._tokens = self._rounds + 1, self._tokens + 1
        self._largest = max(self._largest, 1)
        r.belief = FRESH  # a plain token tests no draft
        r.out.append(
            Round(
                tokens=(t,),
                origins=(_last_origin(0, 0),),
                k=0,
                accepted=0,
                source="none",
                seconds=now - burst.last,
                draft_seconds=0.0,
                width=1,
            )
        )
        if after is None:
            self._burst = None  # the token is not fed: the cache holds all but it, as after a round
            return
        burst.queued, burst.left, burst.last = after, burst.left - 1, now

    def _verify(
        self, requests: list[_Request], rows: list[mx.array]
    ) -> tuple[list[mx.array], SideBySide | None]:
        """Each request's target logits for its rows, and the side-by-side caches if they ran.

        Side by side only where asked, for several requests whose caches
        stack; the same requests as last round keep the same stack.
        """
        side = self._stacked(requests) if self.options.side_by_side and len(requests) > 1 else None
        if side is None:
            self._unstack()
            return self._forward(self.target, rows, [r.t_cache for r in requests]), None
        out = stacked_step(self.target, rows, side)
        width = out.shape[1]
        return [out[j : j + 1, width - x.size :] for j, x in enumerate(rows)], side

    def _stacked(self, requests: list[_Request]) -> SideBySide | None:
        """The side-by-side caches of ``requests``: kept from last round, or laid out now."""
        if self._side is not None and self._side[0] == requests:
            return self._side[1]
        self._unstack()
        caches = [r.t_cache for r in requests]
        if not stackable(self.target, caches):
            return None
        side = SideBySide(caches)
        self._side = (list(requests), side)
        return side

    def _unstack(self) -> None:
        """Gives the requests verified side by side their own target caches back."""
        if self._side is not None:
            members, side = self._side
            self._side = None
            side.restore([r.t_cache for r in members])

    def _forward(
        self, model: nn.Module, rows: Sequence[mx.array], caches: Sequence[list[Any]]
    ) -> list[mx.array]:
        """Each sequence's logits for its new rows: packed where the model allows."""
        if packable(model):
            return packed_forward(model, rows, caches)
        return [model(x[None], cache=c) for x, c in zip(rows, caches, strict=True)]

    def _draft(
        self,
        requests: list[_Request],
        ks: list[int],
        timed: bool,
        stacked: bool,
        cutoff: DraftCutoff,
    ) -> tuple[list[mx.array], list[list[mx.array | int]], list[list[int]], float | None, bool]:
        """Up to ``ks[i]`` draft tokens per request, the steps shared across requests.

        The first step feeds each request what it has committed since it last
        drafted. Where ``stacked``, the steps run on the requests' caches side
        by side (:mod:`app.engine.stacked`), one attention call a layer; from
        the first step where each feeds at most :data:`STACK_FIRST` tokens,
        else from the second. Otherwise they run packed. A request's draft
        may end before its k where ``cutoff`` says (``ks`` then holds what it drafted).

        Returns:
            Each request's proposal (lazy), its proposal distributions (for
            sampling), the tokens its first step fed the draft, where
            ``timed`` when the first step ended (it waits for it), and whether
            steps after the first ran stacked (caches too ragged to stack run packed).
        """
        parts: list[list[mx.array]] = [[] for _ in requests]
        q_rows: list[list[mx.array | int]] = [[] for _ in requests]
        fed = [r.seq[len(r.d_tokens) :] if k else [] for r, k in zip(requests, ks, strict=True)]
        first: float | None = None
        ran_stacked = False
        x: list[mx.array] = [mx.array(f, dtype=mx.int32) for f in fed]
        for step in range(max(ks, default=0)):
            live = [i for i, k in enumerate(ks) if k > step]
            if not live or self.draft is None or any(requests[i].stopped for i in live):
                break
            caches = [c for i in live if (c := requests[i].d_cache) is not None]
            short = step > 0 or max(len(fed[i]) for i in live) <= STACK_FIRST
            if stacked and short and stackable(self.draft, caches):
                at = self._draft_stacked(
                    requests, ks, step, [fed[i] for i in live], x, parts, q_rows, timed, cutoff
                )
                first = at if step == 0 else first
                ran_stacked = True
                break
            if stacked and step > 0 and len(live) > 1:  # too ragged to stack: packed a while
                self.batch_costs.unstackable(sum(1 for k in ks if k))
                stacked = False
            logits = self._forward(self.draft, [x[i] for i in live], caches)
            for i, lg in zip(live, logits, strict=True):
                x[i] = self._propose(requests[i], lg[0, -1:], parts[i], q_rows[i], cutoff, i)
            if timed and step == 0:
                mx.eval([x[i] for i in live])  # the catch-up apart from the steps
                first = time.perf_counter()
            else:
                # The device drafts while Python builds on.
                mx.async_eval([x[i] for i in live], cutoff.latest(live))
            cutoff.check(ks, step, live)
        proposals = [mx.concatenate(p) if p else mx.array([], dtype=mx.int32) for p in parts]
        for i, p in enumerate(parts):
            ks[i] = len(p)  # a cancel may have cut the draft short
        return proposals, q_rows, fed, first, ran_stacked

    def _draft_stacked(
        self,
        requests: list[_Request],
        ks: list[int],
        begin: int,
        fed: list[list[int]],
        x: list[mx.array],
        parts: list[list[mx.array]],
        q_rows: list[list[mx.array | int]],
        timed: bool,
        cutoff: DraftCutoff,
    ) -> float | None:
        """The draft steps from ``begin`` on, the drafting requests' caches side by side.

        A request whose draft is done still feeds a token (its last) until the
        longest is done; what those steps write is not kept.

        Returns:
            Where ``timed`` and ``begin`` is the first step, when it ended.
        """
        assert self.draft is not None
        live = [i for i, k in enumerate(ks) if k > begin]
        caches = [c for i in live if (c := requests[i].d_cache) is not None]
        steps = max(ks[i] for i in live)
        width = max(len(f) for f in fed) if begin == 0 else 1
        stack = Stack(caches, width + steps - begin - 1)
        first: float | None = None
        for step in range(begin, steps):
            going = [i for i in live if ks[i] > step]
            if not going or any(requests[i].stopped for i in going):
                break
            logits = stacked_step(self.draft, [x[i] for i in live], stack)
            for j, i in enumerate(live):
                if ks[i] > step:
                    last = logits[j, -1:]
                    x[i] = self._propose(requests[i], last, parts[i], q_rows[i], cutoff, i)
            if timed and step == 0:
                mx.eval([x[i] for i in going])
                first = time.perf_counter()
            else:
                mx.async_eval([x[i] for i in going], cutoff.latest(going))
            cutoff.check(ks, step, going)
        # A draft's cache holds what it was fed and all but its last draft token.
        fed_here = [len(f) if begin == 0 else 0 for f in fed]
        kept = [
            n + len(parts[i]) - 1 if parts[i] else 0 for i, n in zip(live, fed_here, strict=True)
        ]
        stack.write_back(caches, kept)
        return first

    def _propose(
        self,
        request: _Request,
        logits: mx.array,
        part: list[mx.array],
        q_row: list[mx.array | int],
        cutoff: DraftCutoff,
        index: int,
    ) -> mx.array:
        """The draft's next token for ``request`` from its ``(1, vocab)`` logits, noted.

        ``cutoff`` notes how sure the draft was of it, for request ``index`` of the round.
        """
        last = logits.astype(mx.float32)
        if self.vocab_size is not None:
            last = fit_vocab(last, self.vocab_size)
        ctx = []
        if request.params.repetition_penalty != 1.0:
            seen = mx.concatenate([penalty_history(request.seq, request.params), *part])
            ctx = [seen[-request.params.repetition_context_size :]]
        position = len(request.seq) + sum(p.shape[0] for p in part)
        token, probs = pick(last, request.params, ctx, request.draws, position)
        if probs is not None:
            q_row.append(probs[0])
        cutoff.note(index, token, probs, last)
        part.append(token)
        return token

    def _judge(
        self,
        request: _Request,
        k: int,
        logits: mx.array,
        proposal: mx.array,
        q_rows: list[mx.array | int],
    ) -> Verdict:
        if k:
            return judge(logits, request.seq, request.params, proposal, q_rows, request.draws)
        history = None
        if request.params.repetition_penalty != 1.0:
            history = penalty_history(request.seq, request.params)
        token = self._pick_plain(request, logits, history, len(request.seq))
        return Verdict([], 0, cast(int, token.item()))

    def _shares(self, requests: list[_Request], ks: list[int]) -> list[float]:
        """The part of this round each drafting request's observation is, of its acceptance's.

        A round fades each acceptance table once, however many of its
        requests it observes (:meth:`app.engine.adaptive.Acceptance.observe`).
        """
        tables = [
            id(self._length(r.params, r.num_draft()).acceptance) if k else None
            for r, k in zip(requests, ks, strict=True)
        ]
        return [1.0 / tables.count(t) if t is not None else 1.0 for t in tables]

    def _commit(
        self,
        request: _Request,
        k: int,
        verdict: Verdict,
        fed: list[int],
        share: float,
        trim: bool = True,
    ) -> None:
        """Keeps the accepted prefix: trims rejected rows from both caches.

        ``share``: the part of the round its observation is (:meth:`_shares`);
        ``trim``: whether the target's cache is its own (side by side, the
        stack masks the rejected rows instead).
        """
        n = verdict.accepted
        if trim:
            rewind(request.t_cache, k - n)  # at most a round's rows: within any slack
        if k:
            length = self._length(request.params, request.num_draft())
            if self.options.stretch:
                request.belief = length.observe(k, n, request.belief, share)
            else:
                length.observe(k, n, share=share)
        else:
            request.belief = FRESH  # a plain token tests no draft
        committed = [*request.seq, *verdict.proposed[:n], verdict.next_token]
        if k and request.d_cache is not None:
            # The draft's cache holds what it was fed and all but its last draft token.
            held = request.d_tokens + fed
            drafted = verdict.proposed[: k - 1]
            keep = draft_kept(held, drafted, committed)
            if rewind(request.d_cache, len(held) + len(drafted) - keep):
                request.d_tokens = (held + drafted)[:keep]
            else:  # past a window's slack: the draft reads the reply again
                assert self.draft is not None
                request.d_cache, request.d_tokens = new_cache(self.draft), []
        request.seq[:] = committed


class _Stream(Generator[Prefill | Round, None, None]):
    """A request's rounds; closed before its first pull, it still leaves the batch.

    A generator closed before it starts never runs its ``finally``, and the
    request joined the batch when it was opened.
    """

    def __init__(
        self, rounds: Generator[Prefill | Round, None, None], leave: Callable[[], None]
    ) -> None:
        self._rounds = rounds
        self._leave: Callable[[], None] | None = leave

    def send(self, value: None) -> Prefill | Round:
        self._leave = None  # started: its own ``finally`` takes it out
        return self._rounds.send(value)

    def throw(self, *args: Any) -> Prefill | Round:
        self._leave = None
        return self._rounds.throw(*args)

    def close(self) -> None:
        self._rounds.close()
        leave, self._leave = self._leave, None
        if leave is not None:
            leave()


@dataclass(frozen=True, slots=True)
class Turns:
    """What pulling requests in turn to their budgets gave.

    Attributes:
        replies: Each request's tokens, cut to the budget.
        rounds: Each request's rounds.
        finished: Seconds from the first pull to each request's last token.
        seconds: Seconds from the first pull to the last token of all.
    """

    replies: list[list[int]]
    rounds: list[list[Round]]
    finished: list[float]
    seconds: float


def take_turns(
    gens: Sequence[Generator[Reading | Prefill | Round, None, None]], max_tokens: int
) -> Turns:
    """Pulls each request in turn, as the engine thread does, until each has ``max_tokens``.

    A request is closed as soon as it has its tokens, so it leaves the batch
    and the later rounds verify only the others.
    """
    start = time.perf_counter()
    replies: list[list[int]] = [[] for _ in gens]
    rounds: list[list[Round]] = [[] for _ in gens]
    finished = [0.0] * len(gens)
    live = list(range(len(gens)))
    while live:
        for i in list(live):
            event = next(gens[i])
            if isinstance(event, Round):
                replies[i] += event.tokens
                rounds[i].append(event)
            if len(replies[i]) >= max_tokens:
                finished[i] = time.perf_counter() - start
                gens[i].close()
                live.remove(i)
    seconds = time.perf_counter() - start
    return Turns([r[:max_tokens] for r in replies], rounds, finished, seconds)


def _copyable(*caches: list[Any] | None) -> bool:
    """Whether rows can be copied between these caches: every layer a plain KV cache."""
    return all(type(c) is KVCache for cache in caches for c in cache or ())


def _front(cache: list[Any], n: int) -> list[tuple[mx.array, mx.array]]:
    """The first ``n`` rows, keys and values, of each layer of ``cache``."""
    return [(c.keys[..., :n, :], c.values[..., :n, :]) for c in cache]


def _copied(rows: list[tuple[mx.array, mx.array]]) -> list[KVCache]:
    """A new cache holding ``rows``, each layer's keys and values, laid out as reading
    them would leave it (room for a whole number of the cache's steps)."""
    out = []
    for keys, values in rows:
        n = keys.shape[2]
        room = -(-n // KVCache.step) * KVCache.step
        layer = KVCache()
        layer.keys = mx.zeros((*keys.shape[:2], room, keys.shape[3]), keys.dtype)
        layer.values = mx.zeros((*values.shape[:2], room, values.shape[3]), values.dtype)
        layer.keys[..., :n, :] = keys
        layer.values[..., :n, :] = values
        layer.offset = n
        out.append(layer)
    return out


def _last_origin(k: int, accepted: int) -> Origin:
    """Where a round's own token came from: a bonus, a correction, or a plain step."""
    if not k:
        return Origin.TARGET
    return Origin.BONUS if accepted == k else Origin.CORRECTION


__all__ = [
    "IDLE_READ",
    "PREFILL_CHUNK",
    "BatchDecoder",
    "BatchStats",
    "Turns",
    "take_turns",
]
