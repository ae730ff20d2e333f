"""What a round of several requests costs, by (sequences, rows each), and the k that pays best.

A batched round drafts K steps for the requests that draft (their steps shared,
packed or stacked: :meth:`BatchCosts.stacks` runs the layout measured faster)
and verifies every request's rows in one packed target forward. It costs
u(d) + K·c(d) + V(b, m) + o(b): u(d) what the first draft step costs beyond
the others (it reads what the last round committed), c(d) one draft step of d
sequences, V(b, m) the forward of b sequences of m rows each, o(b) what the
round costs beyond them.
None of them is a line: on MLX's CUDA backend a 70B's packed forward costs
182 ms for 4 × 1 rows, 100 ms for 4 × 4, 145 ms for 4 × 16 and 118 ms for 8 × 1.
So they are measured on the batch's own rounds: a timed round waits for its
first draft step and for its draft before it verifies, so each part is timed.
Rounds of a shape not yet measured are timed, and one in :data:`PROBE_EVERY`
after that.

Where a (b, m) has not run, V is read off b's measured widths (a line between
them), else between measured sequence counts (one sequence is the pair's
single-request profile), else as b requests verified one after another: the
cost of not batching, so that an unmeasured batch plans as its requests would
alone until its rounds say otherwise.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.engine.adaptive import DOUBT, EVIDENCE, EXPLORE_EVERY, MIN_GAIN, Acceptance, spread
from app.engine.costs import (
    K_MAX,
    SAMPLES,
    WARMUP_SAMPLES,
    CostModel,
    CostProfile,
    Samples,
    expected_tokens,
    machine,
)
from app.engine.stretch import best_policy

log = logging.getLogger(__name__)

PROBE_EVERY = 8  # once a shape is measured, one round in this many is still timed
# Drafts whose shapes a sequence count must have run (rows 2, 4, 8 and 16 each):
# between them a line holds. Until they have, every LEARN_EVERY-th round runs one.
GRID = (1, 3, 7, 15)
LEARN_EVERY = 4
# An unmeasured shape is tried only if it would win with its forward this much cheaper
# than its guess: guesses err by less (packed widths of one count differ by under half).
HOPE = 0.5
# Rounds a count of drafting sequences runs packed after its caches were too ragged to stack.
RETRY_STACK = 4 * PROBE_EVERY


@dataclass(frozen=True, slots=True)
class BatchProfile:
    """Measured costs of one pair's batched rounds on one machine.

    Attributes:
        verify: Per sequence count b, ``verify[m - 1]`` is the seconds of one
            packed forward of b sequences of m new rows each; ``None`` where
            not measured.
        draft: Per count of sequences drafting, the seconds of one draft step.
        catchup: Per count of sequences drafting, what a round's first draft step
            costs beyond the others: it feeds the draft what the last round committed.
        stacked: As ``draft``, with the steps after a round's first run on the
            sequences' caches side by side (:mod:`app.engine.stacked`).
        stacked_catchup: As ``catchup``, beyond a stacked step.
        overhead: Per sequence count, what a round costs beyond its draft steps
            and its forward (each request's verdict, the sync, whatever reads it).
        device: MLX's device, as MLX names it.
        mlx: MLX's version.
        measured_at: Unix time of the last change.
    """

    verify: tuple[tuple[int, tuple[float | None, ...]], ...] = ()
    draft: tuple[tuple[int, float], ...] = ()
    overhead: tuple[tuple[int, float], ...] = ()
    catchup: tuple[tuple[int, float], ...] = ()
    stacked: tuple[tuple[int, float], ...] = ()
    stacked_catchup: tuple[tuple[int, float], ...] = ()
    device: str = ""
    mlx: str = ""
    measured_at: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "verify": [[b, list(row)] for b, row in self.verify],
            "draft": [[d, t] for d, t in self.draft],
            "overhead": [[b, t] for b, t in self.overhead],
            "catchup": [[d, t] for d, t in self.catchup],
            "stacked": [[d, t] for d, t in self.stacked],
            "stacked_catchup": [[d, t] for d, t in self.stacked_catchup],
            "device": self.device,
            "mlx": self.mlx,
            "measured_at": self.measured_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchProfile:
        def pairs(key: str) -> tuple[tuple[int, float], ...]:
            return tuple((int(n), float(t)) for n, t in data.get(key, ()))

        verify = tuple(
            (int(b), tuple(None if t is None else float(t) for t in row))
            for b, row in data.get("verify", ())
        )
        return cls(
            verify=verify,
            draft=pairs("draft"),
            overhead=pairs("overhead"),
            catchup=pairs("catchup"),
            stacked=pairs("stacked"),
            stacked_catchup=pairs("stacked_catchup"),
            device=str(data.get("device", "")),
            mlx=str(data.get("mlx", "")),
            measured_at=float(data.get("measured_at", 0.0)),
        )

    def table(self) -> str:
        """ms of each measured forward, one line per sequence count, for the bench."""
        width = max((len(row) for _, row in self.verify), default=0)
        lines = ["sequences x rows each: ms of one packed forward ('-': not run)"]
        lines.append(f"{'b':>3} " + " ".join(f"{m:>6}" for m in range(1, width + 1)))
        for b, row in self.verify:
            cells = ["-" if t is None else f"{t * 1e3:.1f}" for t in row]
            lines.append(f"{b:>3} " + " ".join(f"{c:>6}" for c in cells))
        for name, values in (
            ("draft step by sequences drafting, packed", self.draft),
            ("draft step by sequences drafting, stacked", self.stacked),
            ("first step's catch-up beyond a packed step", self.catchup),
            ("first step's catch-up beyond a stacked step", self.stacked_catchup),
        ):
            ms = ", ".join(f"{d}: {t * 1e3:.1f}" for d, t in values)
            lines.append(f"{name}, ms: {ms or '-'}")
        return "\n".join(lines)


def _points(samples: dict[int, Samples]) -> tuple[tuple[int, float], ...]:
    """(count, value) of every measured sample, by count."""
    return tuple((n, v) for n, s in sorted(samples.items()) if (v := s.value) is not None)


def _line(points: Sequence[tuple[int, float]], x: int) -> float | None:
    """The value at ``x`` of a line through the nearest ``points`` (sorted by x) about it.

    Past the last point the last slope goes on, never downwards; before the
    first, the first value holds.
    """
    if not points:
        return None
    below = [p for p in points if p[0] <= x]
    above = [p for p in points if p[0] > x]
    if below and below[-1][0] == x:
        return below[-1][1]
    if below and above:
        (x0, y0), (x1, y1) = below[-1], above[0]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if above:
        return above[0][1]
    if len(below) == 1:
        return below[0][1]
    (x0, y0), (x1, y1) = below[-2], below[-1]
    return y1 + max((y1 - y0) / (x1 - x0), 0.0) * (x - x1)


class BatchCosts:
    """Running costs of one pair's batched rounds, learned from the rounds. Engine thread only.

    Args:
        single: The pair's single-request costs: one sequence, and the prior of many.
        profile: A stored batch profile to start from.
        on_measured: Called with the profile whenever a shape is first measured.
        widths: Rows per sequence to know: 1 to ``k_max + 1``.
    """

    def __init__(
        self,
        single: CostModel,
        profile: BatchProfile | None = None,
        on_measured: Callable[[BatchProfile], None] | None = None,
        widths: int = K_MAX + 1,
    ) -> None:
        self.single = single
        self.widths = widths
        self.on_measured = on_measured
        self._device, self._mlx = machine()
        self._verify: dict[int, list[Samples]] = {}
        # Draft steps and catch-ups by layout: packed (False) or stacked (True).
        self._draft: dict[bool, dict[int, Samples]] = {False: {}, True: {}}
        self._catchup: dict[bool, dict[int, Samples]] = {False: {}, True: {}}
        self._overhead: dict[int, Samples] = {}
        # Whether the draft can run stacked at all; its decoder says so.
        self.can_stack = True
        self._rounds = 0  # batched rounds seen
        self._barred: dict[int, int] = {}  # count -> last round it may not stack in
        if profile is not None:
            self._load(profile)

    def _load(self, profile: BatchProfile) -> None:
        counted = WARMUP_SAMPLES + SAMPLES  # a stored value is past its warm-up
        for b, values in profile.verify:
            row = self._row(b)
            for i, t in enumerate(values[: self.widths]):
                if t is not None:
                    row[i] = Samples(counted, t, stored=True)

        def samples(pairs: tuple[tuple[int, float], ...]) -> dict[int, Samples]:
            return {n: Samples(counted, t) for n, t in pairs}

        self._draft = {False: samples(profile.draft), True: samples(profile.stacked)}
        self._catchup = {False: samples(profile.catchup), True: samples(profile.stacked_catchup)}
        self._overhead = samples(profile.overhead)

    def _row(self, b: int) -> list[Samples]:
        return self._verify.setdefault(b, [Samples() for _ in range(self.widths)])

    def measured(self, b: int, m: int) -> bool:
        """Whether a forward of ``b`` sequences of ``m`` rows each has its own cost."""
        if b <= 1:
            return self.single.profile().v(m) is not None
        row = self._verify.get(b)
        return row is not None and 1 <= m <= len(row) and row[m - 1].value is not None

    def _along(self, b: int, m: int) -> float | None:
        """V(b, m) from b's own measured widths only.

        A width with fewer than three samples costs no more than the line
        through the others says: one stalled round (a busy host) must not price
        a width out, since a width never chosen is never measured again.
        """
        if b <= 1:
            return self.single.profile().estimate(m)
        row = self._verify.get(b)
        if row is None or all(s.value is None for s in row):
            return None
        values = tuple(s.value for s in row)
        own = CostProfile(values).estimate(m)
        cell = row[m - 1] if 1 <= m <= len(row) else None
        if cell is None or cell.value is None or cell.settled:
            return own
        others = (*values[: m - 1], None, *values[m:])
        line = CostProfile(others).estimate(m) if any(v is not None for v in others) else None
        return own if line is None or own is None else min(own, line)

    def settled(self, b: int, m: int) -> bool:
        """Whether a forward of ``b`` sequences of ``m`` rows each has enough samples to stand."""
        row = self._verify.get(b)
        return b <= 1 or (row is not None and 1 <= m <= len(row) and row[m - 1].settled)

    def verify(self, b: int, m: int) -> float | None:
        """Seconds of one packed forward of ``b`` sequences of ``m`` rows each, measured or not."""
        if (own := self._along(b, m)) is not None:
            return own
        alone = self._along(1, m)
        if alone is None:
            return None
        known = [(1, alone)] + [
            (n, t) for n in sorted(self._verify) if n > 1 and (t := self._along(n, m)) is not None
        ]
        if len(known) == 1:
            return b * alone  # nothing batched has run: as if one after another
        return min(_line(known, b) or b * alone, b * alone)

    def stacks(self, d: int) -> bool:
        """Whether the draft steps of ``d`` sequences after a round's first run stacked.

        Each layout is measured on this count's rounds, stacked first; then
        the cheaper runs, and rounds that probe it keep its cost current.
        """
        if d < 2 or not self.can_stack or self._barred.get(d, -1) >= self._rounds:
            return False
        stacked, packed = self._draft[True].get(d), self._draft[False].get(d)
        if stacked is None or stacked.value is None:
            return True
        if packed is None or packed.value is None:
            return False
        return stacked.value <= packed.value

    def unstackable(self, d: int) -> None:
        """The caches of ``d`` drafting sequences were too ragged to stack: packed for a while.

        Their rounds are priced, and timed, as packed ones until
        :data:`RETRY_STACK` rounds have passed.
        """
        self._barred[d] = self._rounds + RETRY_STACK

    def draft_step(self, d: int) -> float | None:
        """Seconds of one draft step of ``d`` sequences in the layout they run, measured or not."""
        packed = self._packed_step(d)
        if not self.stacks(d):
            return packed
        own = _line(_points(self._draft[True]), d)
        return own if own is not None else packed

    def _packed_step(self, d: int) -> float | None:
        """One packed draft step of ``d`` sequences: measured, a line, or one after another."""
        c1 = self.single.draft_step
        known = list(_points(self._draft[False]))
        if c1 is not None and not any(n == 1 for n, _ in known):
            known.insert(0, (1, c1))
        if not known:
            return None
        if len(known) == 1 and d > known[0][0]:
            return known[0][1] * d / known[0][0]  # as if one after another
        return _line(known, d)

    def overhead(self, b: int) -> float:
        """What a round of ``b`` sequences costs beyond its draft steps and its forward."""
        own = self._overhead.get(b)
        if own is not None and own.value is not None:
            return own.value
        return self.single.profile().overhead

    def catchup(self, d: int) -> float:
        """What the first draft step of ``d`` sequences costs beyond the others (0 unmeasured)."""
        return self._catchup_in(self.stacks(d), d)

    def _catchup_in(self, stacked: bool, d: int) -> float:
        """The catch-up beyond a step of one layout: measured, a line, or 0."""
        layout = self._catchup[stacked]
        own = layout.get(d)
        if own is not None and own.value is not None:
            return own.value
        return _line(_points(layout), d) or 0.0

    def round_seconds(self, b: int, m: int, steps: int, drafting: int) -> float | None:
        """Expected seconds of a round: ``steps`` draft steps of ``drafting`` sequences, V(b, m)."""
        v = self.verify(b, m)
        c = self.draft_step(drafting) if steps else 0.0
        if v is None or c is None:
            return None
        first = self.catchup(drafting) if steps else 0.0
        return first + steps * c + v + self.overhead(b)

    def wants_timing(self, b: int, m: int, drafting: int) -> bool:
        """Whether a round of this shape should be timed part by part: it is not measured yet."""
        if b <= 1:
            return False  # one request's rounds are the single-request profile's business
        draft = self._draft[self.stacks(drafting)].get(drafting)
        return not self.settled(b, m) or (drafting > 0 and (draft is None or draft.value is None))

    def observe_parts(
        self,
        b: int,
        m: int,
        steps: int,
        drafting: int,
        draft: float,
        verify: float,
        first: float | None = None,
        stacked: bool = False,
    ) -> None:
        """A timed round: its ``steps`` draft steps of ``drafting`` sequences took ``draft``
        seconds (the first of them ``first``; the others ``stacked`` or packed), and its
        forward of ``b`` sequences of ``m`` rows each ``verify``.

        With the first step apart, the others price a step and the first's
        excess is the catch-up; without it (or with one step), the whole counts
        as steps less the catch-up known.
        """
        if b <= 1 or not 1 <= m <= self.widths:
            return
        self._rounds += 1
        new = False
        cell = self._row(b)[m - 1]
        was = cell.value
        cell.add(verify)
        new |= was is None and cell.value is not None
        stacked = stacked and steps > 1
        if steps and drafting and draft > 0:
            catchups = self._catchup[stacked]
            if first is not None and steps > 1:
                step = (draft - first) / (steps - 1)
                catchups.setdefault(drafting, Samples()).add(max(0.0, first - step))
            else:
                step = max(draft - self._catchup_in(stacked, drafting), 0.0) / steps
            samples = self._draft[stacked].setdefault(drafting, Samples())
            was = samples.value
            samples.add(step)
            new |= was is None and samples.value is not None
        if new:
            self._report()

    def observe_round(self, b: int, m: int, steps: int, drafting: int, seconds: float) -> None:
        """A round ran ``seconds`` from its start to the next's: its remainder is overhead."""
        if b <= 1:
            return
        self._rounds += 1
        predicted = self.round_seconds(b, m, steps, drafting)
        if predicted is None or seconds <= 0:
            return
        work = predicted - self.overhead(b)
        rest = seconds - work
        if rest > work:
            return  # the thread did something else between the rounds: not this round's cost
        self._overhead.setdefault(b, Samples()).add(max(0.0, rest))

    def profile(self) -> BatchProfile:
        """What is known now, as a value."""
        verify = tuple(
            (b, tuple(s.value for s in row))
            for b, row in sorted(self._verify.items())
            if any(s.value is not None for s in row)
        )

        return BatchProfile(
            verify=verify,
            draft=_points(self._draft[False]),
            overhead=_points(self._overhead),
            catchup=_points(self._catchup[False]),
            stacked=_points(self._draft[True]),
            stacked_catchup=_points(self._catchup[True]),
            device=self._device,
            mlx=self._mlx,
            measured_at=time.time(),
        )

    def _report(self) -> None:
        if self.on_measured is None:
            return
        try:
            self.on_measured(self.profile())
        except OSError:  # a full disk costs a re-measurement later, nothing more
            log.warning("could not store the batch profile", exc_info=True)


@dataclass(frozen=True, slots=True)
class Want:
    """What one request of a batched round allows.

    Attributes:
        acceptance: The running acceptance its drafts are judged by.
        room: The most it may draft this round (its ``k_max``, its budget).
        fixed: Its own fixed k; ``None``: Auto, the batch's plan decides.
    """

    acceptance: Acceptance
    room: int
    fixed: int | None = None


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """Each request's draft length for one round, and what the round is expected to give.

    Attributes:
        ks: Tokens each request drafts, in the order of the wants.
        tokens: Expected tokens the round commits over every request.
        seconds: Expected seconds of the round.
        timed: Whether the round waits for its draft, so both parts are timed.
        explore: A try of a longer draft, so far positions and wide shapes stay known.
    """

    ks: tuple[int, ...]
    tokens: float = 0.0
    seconds: float = 0.0
    timed: bool = False
    explore: bool = False

    @property
    def rate(self) -> float:
        """Expected tokens per second over every request."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(sequences, rows each, draft steps, sequences drafting) of the round."""
        return shape(self.ks)


def shape(ks: Sequence[int]) -> tuple[int, int, int, int]:
    """(sequences, rows each rounded up, draft steps, sequences drafting) of a round of ``ks``."""
    b = len(ks)
    m = math.ceil(sum(k + 1 for k in ks) / b) if b else 0
    return b, m, max(ks, default=0), sum(1 for k in ks if k)


def _rates(wants: Sequence[Want], optimism: float = 0.0) -> dict[int, tuple[float, ...]]:
    """Each distinct acceptance's per-position rates, by identity (requests share them)."""
    return {id(w.acceptance): w.acceptance.rates(optimism) for w in wants}


def evaluate(
    costs: BatchCosts,
    wants: Sequence[Want],
    k: int,
    rates: dict[int, tuple[float, ...]] | None = None,
) -> BatchPlan | None:
    """The round in which every Auto request drafts ``k`` (or its room) and the rest their own.

    ``rates``: each acceptance's rates, where the caller has them already.
    """
    ks = tuple(min(k if w.fixed is None else w.fixed, w.room) for w in wants)
    rates = rates if rates is not None else _rates(wants)
    tokens = sum(
        expected_tokens(rates[id(w.acceptance)], j) for w, j in zip(wants, ks, strict=True)
    )
    seconds = costs.round_seconds(*shape(ks))
    if seconds is None:
        return None
    return BatchPlan(ks, tokens, seconds)


def hoped(costs: BatchCosts, wants: Sequence[Want], k: int) -> float:
    """Tokens per second of :func:`evaluate`'s round were its forward :data:`HOPE` of its guess."""
    plan = evaluate(costs, wants, k)
    b, m, _, _ = shape(plan.ks) if plan is not None else (0, 0, 0, 0)
    v = costs.verify(b, m) if plan is not None else None
    if plan is None or v is None:
        return 0.0
    cheaper = plan.seconds - (1.0 - HOPE) * v
    return plan.tokens / cheaper if cheaper > 0 else 0.0


def plan_batch(
    costs: BatchCosts, wants: Sequence[Want], plain: bool = True, optimism: float = 0.0
) -> BatchPlan | None:
    """The round of highest expected tokens per second over the batch.

    Auto requests share one draft length k (their draft steps are packed, so
    the longest sets the draft's time), each capped by its room; fixed ones
    keep theirs. Every k from 1 (0 too where ``plain``) to the widest room is
    priced by :meth:`BatchCosts.round_seconds`.

    Returns:
        ``None`` when the costs know no verification yet.
    """
    top = max((w.room for w in wants if w.fixed is None), default=0)
    best: BatchPlan | None = None
    rates = _rates(wants, optimism)
    for k in range(0 if plain or top == 0 else 1, top + 1):
        plan = evaluate(costs, wants, k, rates=rates)
        if plan is None:
            return None
        if best is None or plan.rate > best.rate:
            best = plan
    return best


class BatchLength:
    """Chooses each batched round's draft lengths from the batch's costs.

    Args:
        costs: The batch's running costs.
        explore_every: Rounds between two tries of a longer draft.

    Attributes:
        stretch: Let the stretch table's long-run rate replace the plan's k
            where clearly faster (:func:`along_stretches`).
    """

    def __init__(self, costs: BatchCosts, explore_every: int = EXPLORE_EVERY) -> None:
        self.costs = costs
        self.explore_every = explore_every
        self.stretch = True
        self._rounds = 0
        self._explored = 0

    def choose(self, wants: Sequence[Want]) -> BatchPlan:
        """The plan of the next round: ``ks`` in the order of ``wants``."""
        self._rounds += 1
        auto = [w for w in wants if w.fixed is None]
        # Only measured acceptance may rule drafting out, and only where plain
        # decoding still wins with acceptance DOUBT errors higher (as alone).
        plain = bool(auto) and all(w.acceptance.evidence >= EVIDENCE for w in auto)
        best = plan_batch(self.costs, wants, plain)
        if best is not None and plain and not any(best.ks[i] for i, w in _auto(wants)):
            hopeful = plan_batch(self.costs, wants, True, DOUBT)
            if hopeful is not None and any(hopeful.ks[i] for i, _ in _auto(wants)):
                best = plan_batch(self.costs, wants, False)
        if best is None:  # nothing measured at all: a short draft
            best = BatchPlan(tuple(min(4 if w.fixed is None else w.fixed, w.room) for w in wants))
        elif self.stretch:
            best = along_stretches(self.costs, wants, best)
        plan = self._explore(wants, best) if auto else best
        timed = self.costs.wants_timing(*plan.shape[:2], plan.shape[3])
        return replace(plan, timed=timed or plan.explore or self._rounds % PROBE_EVERY == 0)

    def _explore(self, wants: Sequence[Want], best: BatchPlan) -> BatchPlan:
        """Now and then another draft length for the Auto requests.

        While this many sequences have not run a draft of :data:`GRID` that
        could win were its forward cheaper than guessed (:func:`hoped`), every
        :data:`LEARN_EVERY`-th round runs the one nearest the plan's: the costs
        of shapes never run are guesses, and a guess that prices a shape too
        high would never be corrected. After that, every ``explore_every``
        rounds a longer draft, so far positions' acceptance stays known.
        """
        top = max(w.room for w in wants if w.fixed is None)
        current = max((best.ks[i] for i, _ in _auto(wants)), default=0)
        b = len(wants)
        learn = self._rounds % LEARN_EVERY == 0
        unknown = [
            k
            for k in GRID
            if learn and k <= top and k != current and not self.costs.measured(b, k + 1)
        ]
        unknown = [k for k in unknown if hoped(self.costs, wants, k) > best.rate]
        if unknown:
            k = min(unknown, key=lambda j: abs(j - current))
        elif self._rounds % self.explore_every == 0:
            longer = [k for k in spread(top) if k > current]
            if not longer:
                return best
            k = longer[self._explored % len(longer)]
            self._explored += 1
        else:
            return best
        trial = evaluate(self.costs, wants, k)
        return replace(trial, explore=True) if trial is not None else best


def along_stretches(costs: BatchCosts, wants: Sequence[Want], best: BatchPlan) -> BatchPlan:
    """``best``, or the shared k of highest long-run rate along stretches where clearly faster.

    Per-position acceptance learns far positions only from tries of longer
    drafts, and a try starts wherever the last round left off, often in the
    middle of an easy stretch; a longer k's own rounds start past a rejection
    and run further. On the H200 (run 23 in docs/benchmarks-history.md) 8 streams'
    rounds of k = 15 committed 9.1-10.1 tokens a request where the table
    expected 7.9-8.6, so the batch played k = 7, 4-15 % slower. The stretch
    table (:mod:`app.engine.stretch`) learns from every round by distance
    from a stretch's start, and its long-run rate of playing one k in every
    round (``Policy.same``) knows where that k's rounds start. As alone
    (:data:`app.engine.adaptive.MIN_GAIN`), it replaces the plan only where
    clearly faster; only Auto requests of one acceptance, drafting.
    """
    auto = _auto(wants)
    sources = {id(w.acceptance) for _, w in auto}
    current = max((best.ks[i] for i, _ in auto), default=0)
    if len(sources) != 1 or current == 0:
        return best
    top = max(w.room for _, w in auto)
    rates = _rates(wants)  # once for every k, as plan_batch does
    plans = [p for k in range(1, top + 1) if (p := evaluate(costs, wants, k, rates)) is not None]
    if len(plans) < top:
        return best
    # A constant factor on every k's seconds moves no comparison: whole rounds do.
    along = auto[0][1].acceptance.stretch_rates()[: 2 * (top + 1)]
    policy = best_policy(along, [0.0, *(p.seconds for p in plans)], top)
    k = max(range(1, top + 1), key=lambda j: policy.same[j])
    if policy.same[k] < (1.0 + MIN_GAIN) * policy.same[current]:
        return best
    return plans[k - 1]


def _auto(wants: Sequence[Want]) -> list[tuple[int, Want]]:
    return [(i, w) for i, w in enumerate(wants) if w.fixed is None]


__all__ = [
    "PROBE_EVERY",
    "BatchCosts",
    "BatchLength",
    "BatchPlan",
    "BatchProfile",
    "Want",
    "along_stretches",
    "evaluate",
    "plan_batch",
    "shape",
]
