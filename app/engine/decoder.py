"""Tandem's decoder: every reply, a lone one too, is a request of one batch.

A round proposes tokens for every open request (prompt lookup's, then the
draft model's: the draft's steps shared across the requests that draft,
packed, or with their caches side by side where the batch measures that
faster, :mod:`app.engine.stacked`), verifies every proposal in one target
forward (:func:`app.engine.merged.joint_forward` for several), and commits
each request's accepted prefix plus one token of the target's own by the one
rule of :func:`app.engine.rounds.judge`. At temperature 0 a reply is the
target's greedy reply; above 0 it keeps the target's distribution exactly.

A round of one request plans as that request's setting says, from the pair's
single-request costs (:class:`~app.engine.costs.CostModel`), which its rounds
time; it may verify padded to a cheaper width, probes plain decoding now and
then for the baseline, and decodes plainly with a step queued ahead wherever
it drafts nothing (drafting off, Auto finding that it does not pay, lookup
finding nothing). A round of several, where any is on Auto, plans for the
batch's tokens per second from the batch's own costs
(:mod:`app.engine.batch_costs`).

While the same requests run, their target caches are kept side by side
(:mod:`app.engine.side_by_side`): rejected rows masked in place, one
attention call a layer; ``EngineOptions.side_by_side`` off keeps each apart.
A request joins between rounds; the prompts of joining requests are read
:data:`PREFILL_CHUNK` tokens per round in all (:data:`IDLE_READ` while none
decodes). The draft reads a prompt only once the reply has its first token:
a request's first token comes at plain latency, and while its draft lags,
:data:`CATCH_UP_STEP` tokens a round, its rounds are plain steps. The caches
of the last :data:`KEEP` finished requests stay, so a follow-up turn or an
edit reads only what they do not hold; requests that share the start of
their prompts read it once (:data:`SHARE_MIN`).

Pulling a request whose next round has not run yet runs a round for every
request waiting likewise: consumers that take turns (one thread, round
robin) thereby share each round.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from app.engine import attention
from app.engine.adaptive import Acceptance, DraftLength
from app.engine.batch_costs import BatchCosts, BatchLength, Want, shape
from app.engine.caches import back_to, mark, new_cache, reachable, rewind
from app.engine.costs import (
    K_MAX,
    PROFILE_CONTEXT,
    CostModel,
    CostProfile,
    PlainPace,
    Plan,
    ProfileProgress,
    Samples,
    expected_tokens,
    measure_profile,
)
from app.engine.lookup import PromptLookup
from app.engine.merged import joint_forward
from app.engine.mtp import MTPDraft, link, target_rows
from app.engine.observe import (
    EngineEvent,
    Observer,
    PlainBurst,
    PlainToken,
    PrefillChunk,
    PromptCopied,
    RoundPlanned,
    RoundRun,
)
from app.engine.options import DEFAULT_OPTIONS, EngineOptions
from app.engine.recurrent import TARGET_FORWARDS
from app.engine.rounds import (
    DraftControl,
    DraftCutoff,
    Prefill,
    Round,
    Source,
    Verdict,
    check_drafting,
    common_prefix,
    draft_cuts,
    draft_kept,
    drafting_now,
    fit_vocab,
    judge,
    penalty_history,
    pick,
    prepare,
    stop_below,
)
from app.engine.sampling import Draws
from app.engine.side_by_side import SideBySide
from app.engine.stacked import Stack, stackable, stacked_step
from app.engine.stretch import FRESH, Belief
from app.engine.types import DraftSetting, GenerationParams, Origin, Reading

PREFILL_CHUNK = 512  # prompt tokens one round reads for joining requests, in all
IDLE_READ = 4 * PREFILL_CHUNK  # the same while no request decodes (a chunk of each prompt at most)
CATCH_UP_STEP = 128  # tokens a lagging draft reads per round, its request's row plain meanwhile
ROUND_LAG = 2 * K_MAX + 2  # tokens a round's first draft step may feed: a lag beyond is caught up
TIME_DRAFT_EVERY = 8  # a lone request's drafting rounds: one in this many splits draft and verify
STACK_FIRST = 4  # tokens a request's first draft step may feed for that step to run stacked
KEEP = 4  # finished requests whose caches are kept for a follow-up that shares their prefix
PROBE = 4  # plain tokens of a lone request's probe: its third is timed (PlainPace)
# Where Auto expects drafting to beat plain decoding by less than this, probes come four
# times as often: a plain step measured in a slow spell misleads Auto for fewer rounds,
# and a probe costs little where drafting gains little.
PROBE_CLOSE = 1.25
LOOKUP_PLAIN = 2  # plain tokens a lone request decodes where lookup alone finds nothing
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
    lookup: PromptLookup | None = None  # its prompt lookup, where asked
    reports: bool = False  # a Reading goes out before each chunk of its prompt
    started: float = field(default_factory=time.perf_counter)
    read: int = 0  # prompt tokens the target holds
    reused: int = 0  # of those, tokens a finished request's caches held already
    announced: bool = False  # its Prefill is out: it takes part in rounds
    # Its own random draws: no other request's changes its reply.
    draws: Draws = field(default_factory=lambda: Draws(None))
    prompt: int = 0  # tokens of the prompt
    d_tokens: list[int] = field(default_factory=list)  # what the draft's cache holds
    out: deque[Reading | Prefill | Round] = field(default_factory=deque)
    # Where its next round starts along a stretch of accepted drafts.
    belief: Belief = FRESH
    plan: Plan | None = None  # a lone request's next round, chosen before it could run

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

    @property
    def proposes(self) -> bool:
        """Whether anything can propose tokens for it: a draft model or prompt lookup."""
        return self.d_cache is not None or self.lookup is not None

    @property
    def drafting(self) -> DraftSetting:
        """Its draft setting now: its control's where it has one."""
        return drafting_now(self.params, self.control)

    def num_draft(self) -> int | None:
        """Tokens it drafts per round: 0 where nothing proposes, ``None`` on Auto."""
        return self.drafting.num_draft if self.proposes else 0

    def lag(self) -> int:
        """Tokens of its sequence (but the newest) that its draft's cache does not hold."""
        return len(self.seq) - 1 - len(self.d_tokens)


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
    stretch: bool  # Auto's plain stretch: planned anew as it ends, and extended while plain


@dataclass
class _Turn:
    """What one request does in a round: lookup's tokens, then up to ``drafts`` of the draft's.

    Filled in as the round runs: what the draft fed and proposed, and the verdict.
    """

    request: _Request
    looked: list[int]
    drafts: int  # draft tokens asked, then drafted
    width: int = 0  # rows verified, padding included (0: k + 1)
    planned: int = 0  # a lone turn's planned k, which a short draft may verify in fewer rows
    tried: bool = False  # a lone turn that is Auto's try, whose cost its budget hears of
    fed: list[int] = field(default_factory=list)  # tokens the draft's first step fed
    parts: list[mx.array] = field(default_factory=list)  # the proposal, lazily
    q_rows: list[mx.array | int] = field(default_factory=list)  # an int: a one-hot row

    @property
    def k(self) -> int:
        return len(self.looked) + self.drafts

    @property
    def rows(self) -> int:
        return max(self.width, self.k + 1)

    @property
    def drafted(self) -> int:
        """The draft's tokens in the proposal so far (after lookup's)."""
        return len(self.parts) - (1 if self.looked else 0)

    @property
    def source(self) -> Source:
        if self.looked and self.drafts:
            return "lookup+draft"
        if self.looked:
            return "lookup"
        return "draft" if self.drafts else "none"


@dataclass(frozen=True, slots=True)
class _Plan:
    """A round's plan: each request's turn, whether it is timed part by part, and for a
    lone request that drafts nothing, how many tokens it decodes plainly (0: none)."""

    turns: list[_Turn]
    timed: bool = False
    plain: int = 0
    stretch: bool = False  # the plain tokens are Auto's stretch

    @classmethod
    def plain_row(cls, request: _Request, plain: int = 0, stretch: bool = False) -> _Plan:
        """``request`` proposes nothing: one plain row, or ``plain`` tokens decoded plainly."""
        return cls([_Turn(request, [], 0)], plain=plain, stretch=stretch)


def _plain_tokens(plan: Plan, left: int) -> int:
    """Tokens to decode plainly on a plan that drafts nothing, before planning again."""
    return min(max(1, round(plan.tokens)), left)


class Decoder:
    """Runs the rounds of every open request together, on the thread that owns the models.

    Owns every request's caches and keeps finished ones for follow-ups, so it
    belongs to the one thread that runs the models.

    Args:
        target: The model whose output every request gets.
        draft: The model that proposes tokens, if any.
        costs: The pair's single-request costs (a stored profile, say); a fresh
            model measures them as lone requests run.
        batch_costs: The pair's batched-round costs; by default learned afresh.
        options: How it runs (:class:`~app.engine.options.EngineOptions`).
    """

    def __init__(
        self,
        target: nn.Module,
        draft: nn.Module | None = None,
        costs: CostModel | None = None,
        batch_costs: BatchCosts | None = None,
        options: EngineOptions = DEFAULT_OPTIONS,
    ) -> None:
        self.target = target
        self.draft = draft
        self.options = options
        self.costs = costs if costs is not None else CostModel()
        self.batch_costs = batch_costs if batch_costs is not None else BatchCosts(self.costs)
        self._planner = BatchLength(self.batch_costs)
        self._planner.stretch = options.stretch
        self.batch_costs.can_stack = draft is not None and stackable(draft)
        self.vocab_size: int | None = getattr(getattr(target, "args", None), "vocab_size", None)
        # Why the target's cache cannot be rewound ("" where it can); learned on the
        # first request, so that making a decoder costs nothing until it decodes.
        self.refused: str | None = None
        # Whether the pair's caches are plain KV caches, whose rows can be copied.
        self._copies: bool | None = None
        # The target's caches of the requests last verified together, side by side.
        self._side: tuple[list[_Request], SideBySide] | None = None
        # The last round's shape and start, to time it to the next round's start.
        # The last round's proposal sizes, rows (a lone round's) and start, to time it to the
        # next round's start; None where the next would time something else too.
        self._last: tuple[list[int], int, float] | None = None
        # Acceptance per (sampling, lookup) and controllers per setting outlive requests.
        self._acceptance: dict[tuple[bool, bool], Acceptance] = {}
        self._lengths: dict[tuple[int, int | None, bool, bool], DraftLength] = {}
        self._open: list[_Request] = []
        self._burst: _Burst | None = None  # a lone request decoding plainly, pipelined
        self._lone = 0  # rounds lone requests planned, for probes and timing
        # Seconds of one pipelined plain step: a median that a cold first step
        # cannot drag along, the baseline of every speedup shown.
        self._step = Samples()
        self._kept: list[_Kept] = []  # newest last
        self._observers: list[Observer] = []  # told what each round planned and cost

    @property
    def active(self) -> int:
        """Requests open now."""
        return len(self._open)

    @property
    def baseline_tps(self) -> float | None:
        """Plain decoding speed of the target, measured on warm pipelined plain steps.

        ``None`` until a probe after the first was timed (the first runs cold),
        so no speedup is shown against a guess.
        """
        v = self._step.value
        return 1.0 / v if v else None

    def acceptance(self, sampling: bool = False, lookup: bool = False) -> Acceptance:
        """The running acceptance of greedy or sampled drafting, with or without lookup."""
        return self._acceptance.setdefault((sampling, lookup), Acceptance())

    def subscribe(self, observer: Observer) -> None:
        """Tells ``observer`` every event from now on (:mod:`app.engine.observe`)."""
        self._observers.append(observer)

    def generate(
        self,
        prompt: Sequence[int],
        params: GenerationParams,
        control: DraftControl | None = None,
        cancel: threading.Event | None = None,
        reading: bool = False,
    ) -> Generator[Reading | Prefill | Round, None, None]:
        """Opens a request; its generator yields a :class:`Prefill`, then rounds until ``cancel``.

        The request joins at once. The caller stops pulling on end of sequence
        or length; closing the generator, or setting ``cancel`` (asked between
        prompt chunks and draft steps and before a verification), takes the
        request out, its caches holding only what was committed. With
        ``control``, its draft setting replaces ``params.drafting`` from the
        next round on. With ``reading``, a :class:`Reading` comes before each
        chunk of the prompt the target reads (none when a kept cache holds it).

        Raises:
            CacheError: Drafting was asked of a target whose cache cannot be rewound.
        """
        if len(prompt) < 1:
            raise ValueError("a prompt needs at least one token")
        self._prepare()
        wanted = drafting_now(params, control).num_draft
        proposes = self.draft is not None or params.prompt_lookup
        check_drafting(self.refused or None, proposes, wanted)
        drafts = self.draft is not None and not self.refused
        lookup = params.prompt_lookup and not self.refused
        request = _Request(
            seq=list(prompt),
            prompt=len(prompt),
            params=params,
            control=control,
            cancel=cancel,
            t_cache=new_cache(self.target, TARGET_FORWARDS) + target_rows(self.draft),
            d_cache=new_cache(self.draft) if drafts and self.draft is not None else None,
            lookup=PromptLookup() if lookup else None,
            reports=reading,
            draws=Draws(params.seed),
        )
        if self._copies is None:
            self._copies = _copyable(request.t_cache, request.d_cache)
        self._last = None  # a round's period ends where the members change
        self._reuse(request)
        link(request.d_cache, request.t_cache)
        if request.lookup is not None:
            request.lookup.reset(request.seq)
        if reading and request.reading:
            request.out.append(Reading(request.read, request.prompt, request.reused))
        self._open.append(request)  # now, so that it joins the next round even unpulled
        return _Stream(self._stream(request), lambda: self._leave(request))

    def measure_costs(
        self,
        widths: int,
        repeats: int = 2,
        cancel: threading.Event | None = None,
        context: int = PROFILE_CONTEXT,
    ) -> Iterator[ProfileProgress | CostProfile]:
        """Measures the pair's costs (:func:`~app.engine.costs.measure_profile`) on the paths
        its rounds run: the models prepared, its options applied."""
        self._prepare()
        with self.options.applied():
            yield from measure_profile(
                self.target,
                self.draft,
                widths=widths,
                context=context,
                repeats=repeats,
                cancel=cancel,
            )

    def _prepare(self) -> None:
        """Puts the decoder's paths into its models, once (a decoder costs nothing till used)."""
        if self.refused is None:
            with self.options.applied():
                self.refused = prepare(self.target, self.draft) or ""

    def forget(self) -> int:
        """Drops the caches kept from finished requests; returns the bytes they held."""
        held = sum(
            getattr(c, "nbytes", 0) for k in self._kept for c in (*k.t_cache, *(k.d_cache or ()))
        )
        self._kept.clear()
        return held

    def _stream(self, request: _Request) -> Generator[Reading | Prefill | Round, None, None]:
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
        self._last = None  # the time to the next round is not this one's
        if keep and not self.refused and request.read:
            held = request.seq[: request.read] if request.reading else request.seq[:-1]
            kept = _Kept(held, request.t_cache, request.d_tokens, request.d_cache)
            self._kept = [*self._kept, kept][-KEEP:]

    def _reuse(self, request: _Request) -> None:
        """Starts ``request`` from the kept caches that share the longest prefix with its prompt.

        A follow-up turn then reads only what is new: it takes the caches over
        (an edit cuts them back first). A prompt that shares only part of what
        they hold (another conversation with the same system prompt, a
        regenerated reply) copies those rows where caches allow, so the
        finished conversation keeps its caches for its own follow-up. The
        draft takes what its kept cache shares; it catches up on the rest.
        """
        goal = request.seq[:-1]
        best = max(self._kept, key=lambda k: common_prefix(k.tokens, goal), default=None)
        n = common_prefix(best.tokens, goal) if best is not None else 0
        if best is None or n == 0:
            return
        nd = common_prefix(best.d_tokens, goal[:n])
        if n < len(best.tokens) and self._copies:
            self._copy_into(request, _front(best.t_cache, n), best.d_cache, n, nd)
            return
        self._kept.remove(best)
        # As far back as every layer can go: a window within its slack, a
        # recurrent state within its newest forwards or to a marked point.
        n = reachable(best.t_cache, n)
        if n == 0:
            return  # read the prompt anew
        back_to(best.t_cache, n)
        request.t_cache, request.read, request.reused = best.t_cache, n, n
        kept = best.d_cache
        if request.d_cache is not None and kept is not None:
            nd = reachable(kept, min(nd, n))
            if nd:
                back_to(kept, nd)
                request.d_cache, request.d_tokens = kept, goal[:nd]

    def _length(self, request: _Request) -> DraftLength:
        """The controller of ``request``'s setting, shared by the requests of that setting."""
        params, limit, num_draft = request.params, request.drafting.limit, request.num_draft()
        sampling, lookup = params.sampled, params.prompt_lookup
        key = (limit, num_draft, sampling, lookup)
        if key not in self._lengths:
            accept = self.acceptance(sampling, lookup)
            self._lengths[key] = DraftLength(limit, num_draft, self.costs, accept)
        return self._lengths[key]

    def step(self) -> None:
        """One round for every open request that waits for one, on this decoder's paths.

        Joining requests read their prompts first, :data:`PREFILL_CHUNK`
        tokens in all (:data:`IDLE_READ` while none decodes), oldest first, in
        one packed forward.
        """
        with self.options.applied():
            self._advance()

    def _advance(self) -> None:
        for gone in [r for r in self._open if r.stopped]:
            self._leave(gone)  # cancelled, perhaps before it was ever pulled
        if self._burst is not None:
            burst = self._burst
            r = burst.request
            if len(self._open) > 1 or r.num_draft() != burst.wanted:
                self._hand_out(burst, go_on=False)  # another joined, or the setting changed
            elif not r.out:
                if burst.left == 1 and burst.stretch:
                    self._extend(burst)
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
                mark(r.t_cache)  # where a retry or an edit of what follows comes back to
                r.out.append(Prefill(len(r.seq), r.reused, time.perf_counter() - r.started))
                r.announced = True
        if ready:
            self._round(ready)

    def _read(self, joining: list[_Request]) -> None:
        """Reads the next chunks of joining requests' prompts into the target's caches.

        A request whose prompt starts as another open request's copies those
        rows instead (:meth:`_share`), waiting where the other reads them in
        the same forward; what it has left is read in a second forward,
        within the same budget. A request that reports its reading reads one
        chunk per step, its :class:`Reading` out before the next.
        """
        left = PREFILL_CHUNK if any(r.announced for r in self._open) else IDLE_READ
        self._last = None  # the next round's period would hold this reading
        waiting = joining
        while True:
            self._share(joining)
            waiting = [r for r in waiting if r.reading and not r.out and not r.stopped]
            if not waiting or left <= 0:
                return
            chunks, waiting = self._chunks(waiting, left)
            left -= sum(len(c) + attention.padding(len(c), r.t_cache) for r, c in chunks)
            self._read_chunks(chunks)
            for r, _ in chunks:
                if r.reports and r.reading:
                    r.out.append(Reading(r.read, r.prompt, r.reused))

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
        gain = common_prefix(source.seq[:held], goal) - request.read
        return gain if gain >= SHARE_MIN else 0

    def _share(self, joining: list[_Request]) -> None:
        """Each reading request copies the prompt rows another open request holds of it.

        A prompt's rows are the first of its caches in any layout: a joining
        request's own, a decoding one's own or side by side with others
        (:meth:`SideBySide.front`), so a copy of them is what reading them
        would leave. The draft copies what the other's draft holds of them.
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
            nd = common_prefix(best.d_tokens, r.seq[:n])
            self._copy_into(r, rows, best.d_cache, n, nd)

    def _copy_into(
        self,
        request: _Request,
        rows: list[tuple[mx.array, mx.array]],
        d_cache: list[Any] | None,
        n: int,
        nd: int,
    ) -> None:
        """Gives ``request`` new caches of the first ``n`` rows of its prompt: the target's
        ``rows``, the draft's first ``nd`` copied from ``d_cache`` (a draft's caches are
        always its own)."""
        request.t_cache = _copied(rows)
        if request.d_cache is not None and d_cache is not None and nd > len(request.d_tokens):
            request.d_cache, request.d_tokens = _copied(_front(d_cache, nd)), request.seq[:nd]
        self._tell(PromptCopied(n - request.read))
        request.reused += n - request.read
        request.read = n
        # Now, so that no lazy slice keeps a whole stack or cache it was cut from.
        mx.eval([c.state for c in (*request.t_cache, *(request.d_cache or ()))])

    def _read_chunks(self, chunks: list[tuple[_Request, list[int]]]) -> None:
        """One target forward of ``chunks`` into their requests' caches."""
        start = time.perf_counter()
        mx.eval(self._read_into(self.target, chunks, [r.t_cache for r, _ in chunks]))
        rows = sum(len(c) for _, c in chunks)
        self._tell(PrefillChunk(rows, len(chunks), time.perf_counter() - start))
        for r, chunk in chunks:
            r.read += len(chunk)

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

    def _behind(self, request: _Request) -> bool:
        """Whether ``request``'s draft lags more than a round's first step feeds."""
        return request.d_cache is not None and request.lag() > ROUND_LAG

    def _catch_up(self, requests: list[_Request]) -> None:
        """Feeds each lagging draft of ``requests`` :data:`CATCH_UP_STEP` more tokens, in one
        forward; what it cost comes out of Auto's budget.

        A request's first round never waits for it: its first token comes at
        plain latency. A request whose draft still lags drafts nothing this round.
        """
        feeding = [r for r in requests if self._behind(r) and r.generated > 0]
        if not feeding or self.draft is None:
            return
        start = time.perf_counter()
        chunks = [(r, r.seq[len(r.d_tokens) : -1][:CATCH_UP_STEP]) for r in feeding]
        caches = [c for r in feeding if (c := r.d_cache) is not None]
        mx.eval(self._read_into(self.draft, chunks, caches))
        seconds = time.perf_counter() - start
        for r, chunk in chunks:
            r.d_tokens += chunk
            if r.num_draft() is None:
                self._length(r).charge(seconds / len(feeding))
        self._last = None  # the next period would hold the feeding

    def _room(self, request: _Request) -> int:
        """The most ``request`` may propose this round: never past its budget or its limit."""
        return max(0, min(request.left - 1, request.drafting.limit))

    def _turn(self, request: _Request, k: int) -> _Turn:
        """``request``'s turn proposing ``k`` tokens: lookup's first, the draft's for the rest."""
        k = min(k, self._room(request))
        looked = request.lookup.propose(k) if request.lookup is not None and k else []
        drafts = k - len(looked) if request.d_cache is not None else 0
        return _Turn(request, looked, drafts)

    def _own(self, request: _Request) -> tuple[int, int]:
        """Tokens ``request`` proposes this round by its own setting, as it would alone.

        Returns:
            That k, and where it is 0, how many tokens it decodes plainly before
            its setting plans again (the rest of its budget where it does not draft).
        """
        wanted = request.num_draft()
        left = request.left
        if wanted == 0:
            return 0, left
        plan = self._length(request).choose(request.belief if self.options.stretch else None)
        k = min(plan.k, self._room(request))
        return k, 0 if k else _plain_tokens(plan, left)

    def _want(self, request: _Request) -> Want:
        """What ``request`` allows the batch's plan: its room, and its own k unless on Auto."""
        wanted = request.num_draft()
        if wanted == 0:
            return Want(self.acceptance(request.params.sampled), 0, 0)
        length = self._length(request)
        auto = wanted is None and request.d_cache is not None
        return Want(length.acceptance, self._room(request), None if auto else length.choose().k)

    def _plan(self, requests: list[_Request]) -> _Plan:
        """Each request's turn this round.

        A lone request plans as its setting says (:meth:`_plan_lone`). Several
        of which any is on Auto plan together, for the batch's tokens per
        second; otherwise each plans by its own setting. A request's first
        round is a plain row: its first token comes at plain latency.
        """
        if len(requests) == 1:
            return self._plan_lone(requests[0])
        if any(r.d_cache is not None and r.num_draft() is None for r in requests):
            plan = self._planner.choose([self._want(r) for r in requests])
            self._tell(RoundPlanned(plan.ks, plan.tokens, plan.seconds, plan.explore))
            ks, timed = list(plan.ks), plan.timed
        else:
            ks = [k for k, _ in (self._own(r) for r in requests)]
            timed = False
        self._catch_up([r for r, k in zip(requests, ks, strict=True) if k])
        turns = [
            self._turn(r, k if r.generated and not self._behind(r) else 0)
            for r, k in zip(requests, ks, strict=True)
        ]
        b, m, _, drafting = shape([t.k for t in turns])
        return _Plan(turns, timed or self.batch_costs.wants_timing(b, m, drafting))

    def _plan_lone(self, request: _Request) -> _Plan:
        """The round of a request alone: plain tokens or a drafting turn, and its timing.

        Plain decoding measures the baseline: a warm-up probe, then one that
        counts, then one every ``options.probe_every`` rounds. A drafting
        round is timed part by part where its width is unmeasured, on a try,
        where the draft step is stale (after a plain stretch), and one in
        :data:`TIME_DRAFT_EVERY`.
        """
        wanted = request.num_draft()
        solo = len(self._open) == 1
        if wanted == 0:
            return _Plan.plain_row(request, request.left if solo else 1)
        every = self.options.probe_every
        unmeasured = every > 0 and self._step.value is None
        if request.generated == 0 and (unmeasured or self._behind(request)):
            return _Plan.plain_row(request)  # the first token at plain latency
        length = self._length(request)
        plan = request.plan
        request.plan = None
        if plan is None:
            plan = length.choose(request.belief if self.options.stretch else None)
            if wanted is None:
                self._tell(RoundPlanned((plan.k,), plan.tokens, plan.seconds, plan.explore))
        self._lone += 1
        if plan.k == 0:
            tokens = _plain_tokens(plan, request.left)
            return _Plan.plain_row(request, tokens if solo else 1, stretch=True)
        self._catch_up([request])
        if self._behind(request):
            request.plan = plan  # run once the draft is ready
            return _Plan.plain_row(request)
        due = every > 0 and (unmeasured or self._probe_due(plan, every, wanted is None))
        if due and request.left >= PROBE:
            return _Plan.plain_row(request, PROBE if solo else 1)
        turn = self._turn(request, plan.k)
        turn.width, turn.planned, turn.tried = plan.width, plan.k, plan.explore
        if not turn.k:
            plain = LOOKUP_PLAIN if solo and request.d_cache is None else 1
            return _Plan([turn], plain=min(plain, request.left))
        missing = plan.width in self.costs.missing()
        timed = missing or plan.explore
        timed |= bool(turn.drafts) and (
            self._lone % TIME_DRAFT_EVERY == 1
            or not self.costs.draft_step
            or self.costs.draft_stale
        )
        return _Plan([turn], timed)

    def _probe_due(self, plan: Plan, every: int, auto: bool) -> bool:
        """Whether this lone round probes plain decoding: one in ``every``, and on ``auto``
        one in a quarter as many where ``plan`` gains less than :data:`PROBE_CLOSE` over it
        (a fixed k needs the baseline only for the gauge)."""
        step = self.costs.profile().step
        close = auto and step is not None and plan.rate * step < PROBE_CLOSE
        return self._lone % (max(1, every // 4) if close else every) == 0

    def _extend(self, burst: _Burst) -> None:
        """Plans anew as Auto's plain stretch hands out its last queued token.

        The next step is queued already, so stretches follow one another
        without the device waiting; a plan that drafts is kept for the round
        that runs it.
        """
        r = burst.request
        if r.left <= 1 or r.stopped:
            return
        plan = self._length(r).choose(FRESH if self.options.stretch else None)
        self._tell(RoundPlanned((plan.k,), plan.tokens, plan.seconds, plan.explore))
        self._lone += 1
        if plan.k:
            r.plan = plan
            return
        more = _plain_tokens(plan, r.left - 1)  # the queued token is one of those left
        self._tell(PlainBurst(more))
        burst.left += more

    def _tell(self, event: EngineEvent) -> None:
        for observer in self._observers:
            observer(event)

    def _stops(self, turns: list[_Turn]) -> list[float]:
        """Per turn, the chance of its draft so far below which its draft ends (0: never).

        One more draft token must be worth its step at the round's expected
        rate (:func:`app.engine.rounds.stop_below`); a request's share of a
        step is the step over the requests it drafts for.
        """
        setting = self.options.draft_cutoff
        cuts = [
            t.drafts > 0 and draft_cuts(t.request.params, t.request.num_draft() is None, setting)
            for t in turns
        ]
        b, m, steps, d = shape([t.drafts for t in turns])
        seconds = self.batch_costs.round_seconds(b, m, steps, d) if any(cuts) else None
        step = self.batch_costs.draft_step(d) if seconds else None
        if not seconds or not step:
            return [0.0] * len(turns)
        tokens = sum(
            expected_tokens(self._length(t.request).acceptance.rates(), t.k) if t.k else 1.0
            for t in turns
        )
        stop = stop_below(step / d, tokens / seconds)
        return [stop if cut else 0.0 for cut in cuts]

    def _round(self, requests: list[_Request]) -> None:
        """Proposes for ``requests``, verifies them all in one forward, commits each."""
        plan = self._plan(requests)
        if plan.plain > 1 and len(self._open) == 1:
            self._begin_plain(requests[0], plan.plain, plan.stretch)
            return
        start = time.perf_counter()
        turns, timed = plan.turns, plan.timed
        lone = len(turns) == 1
        self._close_period(turns, start)
        stacked = self.batch_costs.stacks(shape([t.drafts for t in turns])[3])
        first, stacked = self._draft(turns, timed, stacked, DraftCutoff(self._stops(turns)))
        if any(t.request.stopped for t in turns):
            for t in [t for t in turns if t.request.stopped]:
                self._drop_draft(t)
            turns = [t for t in turns if not t.request.stopped]
            if not turns:
                return
        proposals = [
            mx.concatenate(t.parts) if t.parts else mx.array([], dtype=mx.int32) for t in turns
        ]
        if timed:
            mx.eval(proposals)  # the draft's time apart from the verification's
        draft_end = time.perf_counter()
        if lone:
            self._fit_width(turns[0])
        logits, side = self._verify(turns, proposals)
        ks = [t.k for t in turns]
        round_shape = shape(ks)
        if timed:
            mx.eval(logits)
            verify = time.perf_counter() - draft_end
            if lone:
                self._observe_lone(turns[0], start, first, draft_end, verify)
            else:
                first_step = first - start if first is not None else None
                self.batch_costs.observe_parts(
                    *round_shape, draft_end - start, verify, first_step, stacked
                )
        verdicts = [
            self._judge(t, lg[0].astype(mx.float32), p)
            for t, lg, p in zip(turns, logits, proposals, strict=True)
        ]
        if side is not None:
            side.settle([v.accepted + 1 for v in verdicts])
        seconds = time.perf_counter() - start
        if lone and not timed:
            draft_seconds = (self.costs.draft_step or 0.0) * turns[0].drafts
        else:
            draft_seconds = (draft_end - start) if any(ks) else 0.0
        shares = self._shares(turns)
        for t, v, share in zip(turns, verdicts, shares, strict=True):
            self._commit(t, v, share, trim=side is None)
            self._hand(t, v, seconds, draft_seconds, timed)
            if t.tried:
                self._length(t.request).tried(v.accepted + 1, seconds)
        # A lone round with lookup's tokens costs no draft steps: it prices no width.
        priceable = not lone or (turns[0].drafts > 0 and not turns[0].looked)
        self._last = (ks, turns[0].rows, start) if priceable and not timed else None
        if self._observers:
            priced = self.batch_costs.round_seconds(*round_shape) if len(ks) > 1 else None
            run = RoundRun(
                ks=tuple(ks),
                accepted=tuple(v.accepted for v in verdicts),
                auto=any(t.request.num_draft() is None for t in turns),
                timed=timed,
                stacked=stacked,
                priced=priced,
                seconds=time.perf_counter() - start,  # its commit included
            )
            self._tell(run)

    def _close_period(self, turns: list[_Turn], start: float) -> None:
        """Times the last round from its start to this one's: what it cost, reading it included.

        A lone round teaches the pair's single-request costs; a round of several, the batch's.
        """
        if self._last is not None:
            ks, rows, began = self._last
            if len(ks) == len(turns) == 1:
                self.costs.observe_round(ks[0], rows, start - began)
            elif len(ks) > 1 and len(turns) > 1:
                self.batch_costs.observe_round(*shape(ks), start - began)
        self._last = None

    def _fit_width(self, turn: _Turn) -> None:
        """A lone turn drafted short of its plan verifies in fewer rows where they cost less."""
        if not turn.width or turn.width in self.costs.missing():
            return
        if turn.k < turn.planned:
            padded = self.costs.profile().padded_round(turn.k + 1, keep=turn.width)
            turn.width = padded[1] if padded is not None else turn.width

    def _observe_lone(
        self, turn: _Turn, start: float, first: float | None, draft_end: float, verify: float
    ) -> None:
        """What a timed lone round says of the pair's costs: a draft step and its width.

        A draft step is priced by the steps after the first: what one more
        token costs. The first step's extra (the tokens it feeds, the start
        from a synced device) is then part of what the round costs at its width.
        """
        self.costs.observe_verify(turn.rows, verify, len(turn.request.seq))
        if turn.drafts > 1 and first is not None:
            self.costs.observe_draft_step((draft_end - first) / (turn.drafts - 1))
        elif turn.drafts:
            self.costs.observe_draft_step((draft_end - start) / turn.drafts)

    def _hand(
        self, turn: _Turn, verdict: Verdict, seconds: float, draft_seconds: float, timed: bool
    ) -> None:
        """Queues the round's tokens for ``turn``'s request."""
        r, k, n = turn.request, turn.k, verdict.accepted
        looked = len(turn.looked)
        drafted = Origin.MTP if isinstance(self.draft, MTPDraft) else Origin.DRAFT
        origins = [Origin.LOOKUP if i < looked else drafted for i in range(n)]
        r.out.append(
            Round(
                tokens=(*verdict.proposed[:n], verdict.next_token),
                origins=(*origins, _last_origin(k, n)),
                k=k,
                accepted=n,
                source=turn.source,
                seconds=seconds,
                draft_seconds=draft_seconds if k else 0.0,
                auto=r.num_draft() is None,
                width=turn.rows,
                timed=timed,
            )
        )

    def _drop_draft(self, turn: _Turn) -> None:
        """Gives back what drafting added to a cancelled turn's draft cache (nothing verified)."""
        drafted = turn.drafts
        r = turn.request
        # Its first step fed ``fed``; each later step one drafted token.
        if drafted and r.d_cache is not None and not rewind(r.d_cache, len(turn.fed) + drafted - 1):
            self._draft_anew(r)

    def _draft_anew(self, request: _Request) -> None:
        """Gives ``request`` a fresh draft cache: the draft reads its tokens again."""
        assert self.draft is not None
        request.d_cache, request.d_tokens = new_cache(self.draft), []
        link(request.d_cache, request.t_cache)

    def _verify(
        self, turns: list[_Turn], proposals: list[mx.array]
    ) -> tuple[list[mx.array], SideBySide | None]:
        """Each turn's target logits for its rows, and the side-by-side caches if they ran.

        A lone turn may verify padded: the padding rows come after the real
        ones, so causal attention keeps them out of every logit read, and its
        cache gives them back. Side by side only where asked, for several
        requests whose caches stack; the same requests as last round keep the
        same stack.
        """
        rows = []
        for t, p in zip(turns, proposals, strict=True):
            parts = [mx.array(t.request.seq[-1:], dtype=mx.int32)]
            if t.k:
                parts.append(p)
            if t.rows > t.k + 1:
                filler = t.looked[-1] if t.looked else t.request.seq[-1]
                parts.append(mx.array([filler] * (t.rows - t.k - 1), dtype=mx.int32))
            rows.append(mx.concatenate(parts) if len(parts) > 1 else parts[0])
        requests = [t.request for t in turns]
        side = None
        if self.options.side_by_side and len(requests) > 1:
            side = self._stacked(requests)
        if side is None:
            self._unstack()
            logits = self._forward(self.target, rows, [r.t_cache for r in requests])
            return [lg[:, : t.k + 1] for lg, t in zip(logits, turns, strict=True)], None
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
        """Each sequence's logits for its new rows: one forward where the model allows."""
        joint = joint_forward(model, rows, caches)
        if joint is not None:
            return joint
        return [model(x[None], cache=c) for x, c in zip(rows, caches, strict=True)]

    def _draft(
        self, turns: list[_Turn], timed: bool, stacked: bool, cutoff: DraftCutoff
    ) -> tuple[float | None, bool]:
        """Up to ``turn.drafts`` draft tokens per turn, after its lookup's, the steps shared.

        The first step feeds each turn what its request committed since it
        last drafted, and its lookup's tokens. Where ``stacked``, the steps
        run on the requests' caches side by side (:mod:`app.engine.stacked`),
        one attention call a layer; from the first step where each feeds at
        most :data:`STACK_FIRST` tokens, else from the second. Otherwise they
        run packed. A turn's draft may end before its count where ``cutoff``
        says, or on a cancel (``drafts`` then holds what it drafted).

        Returns:
            Where ``timed``, when the first step ended (it waits for it), and
            whether steps after the first ran stacked.
        """
        for t in turns:
            t.q_rows = list(t.looked)  # an int stands for a one-hot row
            t.parts = [mx.array(t.looked, dtype=mx.int32)] if t.looked else []
            t.fed = t.request.seq[len(t.request.d_tokens) :] + t.looked if t.drafts else []
        ks = [t.drafts for t in turns]
        first: float | None = None
        ran_stacked = False
        x: list[mx.array] = [mx.array(t.fed, dtype=mx.int32) for t in turns]
        for step in range(max(ks, default=0)):
            live = [i for i, k in enumerate(ks) if k > step]
            if not live or self.draft is None or any(turns[i].request.stopped for i in live):
                break
            caches = [c for i in live if (c := turns[i].request.d_cache) is not None]
            short = step > 0 or max(len(turns[i].fed) for i in live) <= STACK_FIRST
            if stacked and short and stackable(self.draft, caches):
                at = self._draft_stacked(turns, ks, step, x, timed, cutoff)
                first = at if step == 0 else first
                ran_stacked = True
                break
            if stacked and step > 0 and len(live) > 1:  # too ragged to stack: packed a while
                self.batch_costs.unstackable(sum(1 for k in ks if k))
                stacked = False
            logits = self._forward(self.draft, [x[i] for i in live], caches)
            for i, lg in zip(live, logits, strict=True):
                x[i] = self._propose(turns[i], lg[0, -1:], cutoff, i)
            if timed and step == 0:
                mx.eval([x[i] for i in live])  # the catch-up apart from the steps
                first = time.perf_counter()
            else:
                # The device drafts while Python builds on.
                mx.async_eval([x[i] for i in live], cutoff.latest(live))
            cutoff.check(ks, step, live)
        for t in turns:
            t.drafts = t.drafted  # a cut or cancel ends it short
        return first, ran_stacked

    def _draft_stacked(
        self,
        turns: list[_Turn],
        ks: list[int],
        begin: int,
        x: list[mx.array],
        timed: bool,
        cutoff: DraftCutoff,
    ) -> float | None:
        """The draft steps from ``begin`` on, the drafting requests' caches side by side.

        A turn whose draft is done still feeds a token (its last) until the
        longest is done; what those steps write is not kept.

        Returns:
            Where ``timed`` and ``begin`` is the first step, when it ended.
        """
        assert self.draft is not None
        live = [i for i, k in enumerate(ks) if k > begin]
        caches = [c for i in live if (c := turns[i].request.d_cache) is not None]
        steps = max(ks[i] for i in live)
        width = max(len(turns[i].fed) for i in live) if begin == 0 else 1
        stack = Stack(caches, width + steps - begin - 1)
        first: float | None = None
        for step in range(begin, steps):
            going = [i for i in live if ks[i] > step]
            if not going or any(turns[i].request.stopped for i in going):
                break
            logits = stacked_step(self.draft, [x[i] for i in live], stack)
            for j, i in enumerate(live):
                if ks[i] > step:
                    x[i] = self._propose(turns[i], logits[j, -1:], cutoff, i)
            if timed and step == 0:
                mx.eval([x[i] for i in going])
                first = time.perf_counter()
            else:
                mx.async_eval([x[i] for i in going], cutoff.latest(going))
            cutoff.check(ks, step, going)
        # A draft's cache holds what it was fed and all but its last draft token.
        kept = []
        for i in live:
            drafted = turns[i].drafted
            fed = len(turns[i].fed) if begin == 0 else 0
            kept.append(fed + drafted - 1 if drafted else 0)
        stack.write_back(caches, kept)
        return first

    def _propose(self, turn: _Turn, logits: mx.array, cutoff: DraftCutoff, index: int) -> mx.array:
        """The draft's next token for ``turn`` from its ``(1, vocab)`` logits, noted.

        ``cutoff`` notes how sure the draft was of it, for turn ``index`` of the round.
        """
        request = turn.request
        last = logits.astype(mx.float32)
        if self.vocab_size is not None:
            last = fit_vocab(last, self.vocab_size)
        ctx = []
        if request.params.penalized:
            seen = mx.concatenate([penalty_history(request.seq, request.params), *turn.parts])
            ctx = [seen[-request.params.repetition_context_size :]]
        position = len(request.seq) + sum(p.shape[0] for p in turn.parts)
        token, probs = pick(last, request.params, ctx, request.draws, position)
        if probs is not None:
            turn.q_rows.append(probs[0])
        cutoff.note(index, token, probs, last)
        turn.parts.append(token)
        return token

    def _judge(self, turn: _Turn, logits: mx.array, proposal: mx.array) -> Verdict:
        request = turn.request
        if turn.k:
            return judge(logits, request.seq, request.params, proposal, turn.q_rows, request.draws)
        history = None
        if request.params.penalized:
            history = penalty_history(request.seq, request.params)
        token = self._pick_plain(request, logits, history, len(request.seq))
        return Verdict([], 0, cast(int, token.item()))

    def _shares(self, turns: list[_Turn]) -> list[float]:
        """The part of this round each proposing turn's observation is, of its acceptance's.

        A round fades each acceptance table once, however many of its
        requests it observes (:meth:`app.engine.adaptive.Acceptance.observe`).
        """
        tables = [id(self._length(t.request).acceptance) if t.k else None for t in turns]
        return [1.0 / tables.count(t) if t is not None else 1.0 for t in tables]

    def _commit(self, turn: _Turn, verdict: Verdict, share: float, trim: bool = True) -> None:
        """Keeps the accepted prefix: gives back rejected and padding rows in both caches.

        ``share``: the part of the round its observation is (:meth:`_shares`);
        ``trim``: whether the target's cache is its own (side by side, the
        stack masks the rejected rows instead).
        """
        request, k, n = turn.request, turn.k, verdict.accepted
        if trim:
            rewind(request.t_cache, turn.rows - 1 - n)  # a round's rows: within any slack
        if k:
            length = self._length(request)
            if self.options.stretch:
                request.belief = length.observe(k, n, request.belief, share)
            else:
                length.observe(k, n, share=share)
        else:
            request.belief = FRESH  # a plain token tests no draft
        new = [*verdict.proposed[:n], verdict.next_token]
        committed = [*request.seq, *new]
        if turn.drafts and request.d_cache is not None:
            # The draft's cache holds what it was fed and all but its last draft token.
            held = request.d_tokens + turn.fed
            drafted = verdict.proposed[len(turn.looked) : k - 1]
            keep = draft_kept(held, drafted, committed)
            if rewind(request.d_cache, len(held) + len(drafted) - keep):
                request.d_tokens = (held + drafted)[:keep]
            else:  # past a window's slack: the draft reads the reply again
                self._draft_anew(request)
        request.seq[:] = committed
        if request.lookup is not None:
            request.lookup.extend(new)

    def _begin_plain(self, request: _Request, tokens: int, stretch: bool = False) -> None:
        """Plain decoding of the lone ``request`` for up to ``tokens`` tokens, pipelined.

        One step stays queued ahead of the token handed out: a round's token
        would wait on Python between steps. Each token is drawn as a round of
        no draft draws it (:meth:`_pick_plain`), so replies do not change.
        :meth:`step` ends the burst once another request opens or the
        request's setting changes, handing out the queued token first.
        """
        self._last = None  # the next round's period would hold these steps
        token = mx.array(request.seq[-1:], dtype=mx.int32)
        queued = self._plain_next(request, token, request.seq[:-1], evaluate=False)
        began = time.perf_counter()
        mx.async_eval(queued)
        wanted = request.num_draft()
        self._burst = _Burst(request, queued, tokens, wanted, PlainPace(), began, stretch)
        self._tell(PlainBurst(tokens))
        self._hand_out(self._burst, go_on=tokens > 1)

    def _plain_next(
        self, request: _Request, token: mx.array, before: Sequence[int], evaluate: bool = True
    ) -> mx.array:
        """The token after ``token`` (lazy; queued where ``evaluate``), fed to the target's
        cache; ``before`` precedes it."""
        logits = self._forward(self.target, [token], [request.t_cache])[0][0]
        history = None
        if request.params.penalized:
            size = request.params.repetition_context_size
            history = mx.concatenate([penalty_history(before, request.params), token])[-size:]
        out = self._pick_plain(request, logits.astype(mx.float32), history, len(before) + 1)
        if evaluate:
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
        step = burst.pace.token(now, behind=after is not None)
        if step is not None:  # what the baseline and Auto weigh rounds against
            self._step.add(step)
            self.costs.observe_step(step)
        r.seq.append(t)
        if r.lookup is not None:
            r.lookup.extend([t])
        self._tell(PlainToken())
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
                auto=burst.stretch,
                width=1,
            )
        )
        if after is None:
            self._burst = None  # the token is not fed: the cache holds all but it, as after a round
            return
        burst.queued, burst.left, burst.last = after, burst.left - 1, now


class _Stream(Generator[Reading | Prefill | Round, None, None]):
    """A request's events; closed before its first pull, it still leaves the decoder.

    A generator closed before it starts never runs its ``finally``, and the
    request joined when it was opened.
    """

    def __init__(
        self,
        rounds: Generator[Reading | Prefill | Round, None, None],
        leave: Callable[[], None],
    ) -> None:
        self._rounds = rounds
        self._leave: Callable[[], None] | None = leave

    def send(self, value: None) -> Reading | Prefill | Round:
        self._leave = None  # started: its own ``finally`` takes it out
        return self._rounds.send(value)

    def throw(self, *args: Any) -> Reading | Prefill | Round:
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

    A request is closed as soon as it has its tokens, so it leaves and the
    later rounds verify only the others.
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
    "Decoder",
    "Turns",
    "take_turns",
]
