"""What a round costs on this machine, and the draft length that pays best.

A round that drafts k tokens costs k·c + v(w): k pipelined draft steps of c
seconds each and one target forward of w ≥ k + 1 tokens. Backends do not price
w as a line: MLX's CUDA backend runs its 4-bit kernel once per row below 8 rows
and one tile from 8, and Metal's ``qmv_wide`` covers rows in tiles of 5 up to a
per-chip limit. So v is measured for every width (a :class:`CostProfile`),
verification is padded to the cheapest width at or above k + 1 (v̂; where new
widths build kernels, widths within noise of it count as equal and one is kept),
and k is chosen to maximise expected tokens per second over the whole range.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from app.files import read_entries, write_entries

log = logging.getLogger(__name__)

K_MAX = 16  # the longest draft anywhere in the app
# Plain tokens per round while Auto finds that drafting does not pay; a burst's
# last step is not pipelined, so longer bursts lose less.
PLAIN_BURST = 32
FILE_VERSION = 1
WARMUP_SAMPLES = 1  # the first forward of a new width builds kernels; it is not counted
SAMPLES = 1  # counted forwards per width before it counts as measured (rounds refine it)
WINDOW = 7  # recent samples a running cost is the median of
PACE_STEPS = 8  # plain steps a plain step's sample averages, at most
# Rounds a width must have run before its own cost counts at all: the median of
# three ignores one stalled round, of one or two not.
ROUND_SAMPLES = 3
# Rounds of evidence the shared fixed cost is worth against a width's own rounds.
# Rounds of one shape spread by a third on a busy host, so a few of them at one
# width must not price it out; many that agree do.
ROUND_PRIOR = 4.0
# Rounds at other widths after which a width's own cost no longer counts. Costs
# drift on a busy host: a width priced up in a slow spell would otherwise stay
# priced up, unvisited, for good; now it is tried again and measured afresh.
ROUND_STALE = 32
# Plain steps and drafting rounds since a step's or a width's last sample after which
# its next sample starts it afresh: while Auto decodes plainly the draft's cost goes
# unsampled, while it drafts the plain step does (but for its rare probes), and a
# median kept across a spell compares costs of two speeds of the machine.
COST_STALE = 32
# Where a new width builds kernels (65-80 ms a width for a 70B on MLX's CUDA
# backend, where widths 9-16 cost the same within noise), switching widths on noise
# pays that again and again. Widths count as equal within what a build costs over
# SHAPE_ROUNDS rounds plus SHAPE_NOISE of the cost: rounds of one shape spread by a
# third on a busy host, and their medians by a tenth.
SHAPE_ROUNDS = 16
SHAPE_NOISE = 0.1
BUILD_FLOOR = 0.25  # of a plain step: a smaller build is measurement noise
DRAFT_RUNS = 3  # timed runs of the draft's step in a profile; the fastest counts
PLAIN_STEPS = 8  # queued target steps a profile's plain step is timed over, per run
PLAIN_RUNS = 2
PLAIN_QUEUED = 2 + PLAIN_STEPS * PLAIN_RUNS  # target steps in all, the kernels' two first


def expected_tokens(accept: Sequence[float], k: int) -> float:
    """Tokens a round of ``k`` drafts commits on average, bonus or correction included.

    Args:
        accept: Per-position acceptance: ``accept[i]`` is the chance that draft
            position ``i + 1`` survives given that the ones before it did.
        k: Tokens drafted; positions past ``accept`` use its last value.
    """
    total, survive = 1.0, 1.0
    for i in range(k):
        a = accept[min(i, len(accept) - 1)] if accept else 0.0
        survive *= a
        total += survive
    return total


def geometric(alpha: float, k_max: int = K_MAX) -> tuple[float, ...]:
    """The same acceptance ``alpha`` at every position."""
    return (alpha,) * max(1, k_max)


@dataclass(frozen=True, slots=True)
class CostProfile:
    """Measured costs of one pair on one machine.

    Attributes:
        verify: ``verify[m - 1]`` is the seconds of one target forward of ``m``
            tokens against a cache of ``context`` tokens; ``None`` where not measured.
        draft_step: Seconds of one pipelined draft step; ``None`` without a draft.
        context: Cache length the widths were measured against.
        device: MLX's device, as MLX names it.
        mlx: MLX's version; another version needs a new profile.
        measured_at: Unix time of the measurement.
        overhead: Seconds a drafting round costs beyond its draft steps and its
            verification (graph building, the draft's catch-up, the sync and
            whatever reads the round), learned from the rounds themselves.
        rounds: ``rounds[m - 1]`` is what a drafting round whose verification has
            ``m`` rows took beside its draft steps, learned from the rounds that
            ran at that width; ``None`` where none ran.
        round_samples: ``round_samples[m - 1]`` is how many rounds back
            ``rounds[m - 1]`` (a stored value without a count weighs as a full window).
        build: Seconds the first forward of a width costs beyond its steady cost
            (the kernels it builds), the median over widths; 0 where nothing is built.
    """

    verify: tuple[float | None, ...]
    draft_step: float | None = None
    context: int = 0
    device: str = ""
    mlx: str = ""
    measured_at: float = 0.0
    overhead: float = 0.0
    rounds: tuple[float | None, ...] = ()
    round_samples: tuple[int, ...] = ()
    build: float = 0.0

    @property
    def widths(self) -> int:
        """The widest verification measured or planned for."""
        return len(self.verify)

    @property
    def step(self) -> float | None:
        """Seconds of one plain target step: the verification of one token."""
        return self.verify[0] if self.verify else None

    @property
    def complete(self) -> bool:
        return bool(self.verify) and all(v is not None for v in self.verify)

    def v(self, m: int) -> float | None:
        """Measured seconds of verifying ``m`` tokens."""
        return self.verify[m - 1] if 1 <= m <= len(self.verify) else None

    def estimate(self, m: int) -> float | None:
        """``v(m)``, or where unmeasured a line through the nearest measured widths."""
        if (own := self.v(m)) is not None:
            return own
        known = [(i + 1, t) for i, t in enumerate(self.verify) if t is not None]
        if not known:
            return None
        below = [p for p in known if p[0] < m]
        above = [p for p in known if p[0] > m]
        if below and above:
            (m0, t0), (m1, t1) = below[-1], above[0]
            return t0 + (t1 - t0) * (m - m0) / (m1 - m0)
        if not above:  # past the widest measured: extend the last slope, never downwards
            if len(known) == 1:
                return known[0][1]
            (m0, t0), (m1, t1) = known[-2], known[-1]
            return t1 + max((t1 - t0) / (m1 - m0), 0.0) * (m - m1)
        return above[0][1]  # narrower than any measured: no cheaper than the narrowest

    def padded(self, m: int, keep: int | None = None) -> tuple[float, int] | None:
        """v̂(m) = min over m' ≥ m of v(m'), and that m' (the width to verify with).

        See :meth:`_cheapest` for ``keep`` and for widths that cost about the same.
        """
        return self._cheapest(m, self.estimate, keep)

    def round_seconds(self, m: int) -> float | None:
        """A drafting round verifying ``m`` rows, draft steps aside.

        The measured forward plus a fixed cost: the one every round shows, or
        where rounds ran at that width, a blend of it and theirs, weighted by how
        many ran (:data:`ROUND_PRIOR`). Rounds see what a lone forward does not
        (the key lengths of a growing conversation, the sync, whatever reads them).
        """
        v = self.estimate(m)
        if v is None:
            return None
        if 1 <= m <= len(self.rounds) and (seen := self.rounds[m - 1]) is not None:
            n = self.round_samples[m - 1] if m <= len(self.round_samples) else WINDOW
            return v + (n * (seen - v) + ROUND_PRIOR * self.overhead) / (n + ROUND_PRIOR)
        return v + self.overhead

    def padded_round(self, m: int, keep: int | None = None) -> tuple[float, int] | None:
        """The cheapest round verifying at least ``m`` rows, and its width.

        Like :meth:`padded`, with what rounds cost rather than lone forwards.
        """
        return self._cheapest(m, self.round_seconds, keep)

    def _cheapest(
        self, m: int, cost: Callable[[int], float | None], keep: int | None = None
    ) -> tuple[float, int] | None:
        """The lowest ``cost`` over widths m … and the width it is at.

        Where a new width builds kernels (:attr:`build`), widths within what a
        build costs over :data:`SHAPE_ROUNDS` rounds count as equal: ``keep``
        (the width in use) stays if it is one of them, else the widest is taken,
        so that longer drafts verify in the same shape.
        """
        costs = [(t, w) for w in range(m, max(m, self.widths) + 1) if (t := cost(w)) is not None]
        if not costs:
            return None
        best = min(costs)  # on a tie, the narrowest
        margin = self.shape_margin(best[0])
        if margin <= 0:
            return best
        near = [(t, w) for t, w in costs if t <= best[0] + margin]
        kept = [(t, w) for t, w in near if w == keep]
        return kept[0] if kept else max(near, key=lambda tw: tw[1])

    def shape_margin(self, seconds: float) -> float:
        """How much dearer than ``seconds`` a width may be and still count as equal.

        Zero where new widths build nothing worth counting (Metal, the CPU).
        """
        step = self.step or 0.0
        if self.build <= BUILD_FLOOR * step or step <= 0:
            return 0.0
        return self.build / SHAPE_ROUNDS + SHAPE_NOISE * seconds

    def steps(self, m: int) -> float | None:
        """Verifying ``m`` tokens, as a multiple of one plain step."""
        t, step = self.estimate(m), self.step
        return t / step if t is not None and step else None

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "verify": list(self.verify),
            "rounds": list(self.rounds),
            "round_samples": list(self.round_samples),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostProfile:
        verify = tuple(None if v is None else float(v) for v in data["verify"])
        step = data.get("draft_step")
        return cls(
            verify=verify,
            draft_step=None if step is None else float(step),
            context=int(data.get("context", 0)),
            device=str(data.get("device", "")),
            mlx=str(data.get("mlx", "")),
            measured_at=float(data.get("measured_at", 0.0)),
            overhead=max(0.0, float(data.get("overhead", 0.0))),
            rounds=tuple(None if r is None else float(r) for r in data.get("rounds", ())),
            round_samples=tuple(int(n) for n in data.get("round_samples", ())),
            build=max(0.0, float(data.get("build", 0.0))),
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """A round's shape: ``k`` drafts verified in one forward of ``width`` tokens.

    Attributes:
        k: Tokens to draft.
        width: Rows of the verification; ``width - k - 1`` of them are padding.
        tokens: Expected tokens the round commits.
        seconds: Expected seconds of the round.
        steps: The verification's cost as a multiple of one plain step, if known.
        explore: A try of a longer draft: the round is timed, so that the
            width's cost is learned as well as the far positions' acceptance.
    """

    k: int
    width: int
    tokens: float = 0.0
    seconds: float = 0.0
    steps: float | None = None
    explore: bool = False

    @property
    def rate(self) -> float:
        """Expected tokens per second."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def reason(self) -> str:
        """Why this k, in words: for example "9 tokens verify for 1.7 steps"."""
        if self.k == 0:
            return "drafting does not pay here: plain decoding is faster"
        if self.steps is None:
            return f"k = {self.k}"
        pad = f" (padded to {self.width})" if self.width > self.k + 1 else ""
        return f"{self.k + 1} tokens verify for {self.steps:.1f} steps{pad}"


def plan_round(
    profile: CostProfile,
    accept: Sequence[float],
    k_max: int,
    k: int | None = None,
    plain: bool = True,
    keep: int | None = None,
) -> Plan | None:
    """The plan of highest expected tokens per second, or the plan of a fixed ``k``.

    Args:
        profile: Costs to plan with; unmeasured widths are estimated.
        accept: Per-position acceptance (see :func:`expected_tokens`).
        k_max: Longest draft to consider.
        k: Plan this k only (still padded to its cheapest width).
        plain: Whether plain decoding (k = 0) competes when k is free: where
            drafting cannot pay, Auto should not draft.
        keep: The width in use, kept where another saves less than a kernel build
            (see :meth:`CostProfile.padded_round`).

    Returns:
        ``None`` when the profile has no verification cost yet.
    """
    c = profile.draft_step or 0.0
    best: Plan | None = None
    if k is None and plain and profile.step:
        best = Plan(k=0, width=1, tokens=PLAIN_BURST, seconds=PLAIN_BURST * profile.step, steps=1.0)
    for j in [k] if k is not None else range(1, max(1, k_max) + 1):
        # What rounds cost, their fixed part included: it favours longer drafts.
        padded = profile.padded_round(j + 1, keep)
        if padded is None:
            return None
        seconds, width = padded
        steps = profile.steps(width)
        plan = Plan(
            k=j,
            width=width,
            tokens=expected_tokens(accept, j),
            seconds=j * c + seconds,
            steps=steps,
        )
        if best is None or plan.rate > best.rate:
            best = plan
    return best


def predicted_rates(profile: CostProfile, accept: Sequence[float], k_max: int) -> list[Plan]:
    """The plan of every fixed k from 1 to ``k_max``, for charts."""
    plans = [plan_round(profile, accept, k_max, k) for k in range(1, k_max + 1)]
    return [p for p in plans if p is not None]


@dataclass
class PlainPace:
    """Pipelined plain steps, timed from the first token read.

    A plain loop keeps one step queued ahead of the token it hands out. Three
    backends' ways of running a queued step each fool a simpler clock: CUDA
    may run it inside ``async_eval`` (a token read with no step queued behind
    it came with the one before), may run two together (the gap between two
    tokens is no step), and the first step waits on its launch with nothing
    to overlap (an average from when it was queued holds that). On an H200
    such an average over a two-step probe read 48 ms for a 27B-shaped hybrid's
    33 ms step, and Auto drafted where plain decoding was faster. Two steps or
    more since the first token, to a token with a step queued behind it, are
    none of these. The average runs over the last :data:`PACE_STEPS` steps at
    most: from the first token, a burst's slow start stayed in every later
    sample (38 ms where steps had come back to 27).
    """

    steps: int = 0  # tokens read so far
    read: deque[float] = field(default_factory=lambda: deque(maxlen=PACE_STEPS + 1))

    def token(self, now: float, behind: bool) -> float | None:
        """One more token read at ``now``, ``behind``: whether a step was queued behind it.

        Returns:
            Seconds a step takes, where this token can tell; else None.
        """
        self.steps += 1
        self.read.append(now)
        if self.steps < 3 or not behind:
            return None
        return (now - self.read[0]) / (len(self.read) - 1)


@dataclass
class Samples:
    """Recent samples of one cost; its value is their lower median.

    Costs are heavy-tailed: the first forward of a new shape builds kernels,
    and a collection or another process can stall one round. A median ignores
    such a sample where a moving average would carry it for many rounds, and a
    short window still follows a real change within a few samples.
    """

    seen: int = 0
    value: float | None = None
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    stored: bool = False  # the value came from a stored profile
    weight: int = 0  # samples a stored value stands for
    last: int = 0  # its owner's clock at the last sample

    @property
    def settled(self) -> bool:
        """Whether enough samples back the value to count beside an estimate."""
        return self.stored or len(self.recent) >= ROUND_SAMPLES

    @property
    def count(self) -> int:
        """Samples behind the value: the recent ones, or what a stored value stands for."""
        return max(len(self.recent), self.weight if self.stored else 0)

    def __post_init__(self) -> None:
        if self.value is not None and not self.recent:
            self.recent.append(self.value)  # a stored measurement counts as one sample

    def stale(self, clock: int, after: int = COST_STALE) -> bool:
        """Whether its owner's ``clock`` ticked more than ``after`` times since the last sample."""
        return clock - self.last > after

    def add(self, seconds: float, clock: int | None = None) -> None:
        """One more sample; with its owner's ``clock``, one after :data:`COST_STALE` ticks
        without any starts the median afresh."""
        self.seen += 1
        if self.seen <= WARMUP_SAMPLES:
            return
        if clock is not None:
            if self.stale(clock):
                self.recent.clear()
            self.last = clock
        self.recent.append(seconds)
        self.value = statistics.median_low(self.recent)


class CostModel:
    """Running verification and draft costs of one pair, kept by its decoder.

    It starts from a stored :class:`CostProfile` when there is one and follows
    the rounds from then on. Engine thread only.

    Args:
        widths: Verification widths to know: 1 to ``k_max + 1``.
        profile: A stored profile to start from.
        on_complete: Called with the profile once every width is measured.
    """

    def __init__(
        self,
        widths: int = K_MAX + 1,
        profile: CostProfile | None = None,
        on_complete: Callable[[CostProfile], None] | None = None,
    ) -> None:
        self.widths = widths
        self.on_complete = on_complete
        self._device, self._mlx = machine()
        self._load(profile)
        self._reported = self.complete

    def _load(self, profile: CostProfile | None) -> None:
        """Starts from ``profile``'s measurements, or from nothing."""
        self._verify = [Samples() for _ in range(self.widths)]
        self._draft = Samples(seen=WARMUP_SAMPLES)
        # No fixed cost until two rounds show one: a lone first sample may be a
        # kernel build (7.7 s on an H200), which no try of drafting could pay back.
        self._overhead = Samples(seen=WARMUP_SAMPLES, value=0.0)
        # The first round at a width may build kernels: not counted, as for forwards.
        self._rounds = [Samples() for _ in range(self.widths)]
        self._round_clock = 0  # rounds observed so far: what ages a width's rounds (their last)
        self._clock = 0  # plain steps and drafting rounds observed: what ages a cost
        self._context = 0
        self._build = 0.0
        self._cached: CostProfile | None = None
        if profile is None:
            return
        self._build = profile.build
        for i, t in enumerate(profile.verify[: self.widths]):
            if t is not None:
                self._verify[i] = Samples(WARMUP_SAMPLES + SAMPLES, t)
        if profile.draft_step is not None:
            self._draft = Samples(WARMUP_SAMPLES + SAMPLES, profile.draft_step)
        if profile.overhead > 0:
            self._overhead = Samples(WARMUP_SAMPLES + SAMPLES, profile.overhead)
        counts = profile.round_samples
        for i, r in enumerate(profile.rounds[: self.widths]):
            if r is not None:
                n = counts[i] if i < len(counts) else WINDOW
                self._rounds[i] = Samples(WARMUP_SAMPLES + SAMPLES, r, stored=True, weight=n)
        self._context = profile.context

    @property
    def complete(self) -> bool:
        """Whether every width has its counted samples."""
        return all(s.seen >= WARMUP_SAMPLES + SAMPLES for s in self._verify)

    @property
    def draft_step(self) -> float | None:
        return self._draft.value

    def missing(self) -> list[int]:
        """Widths (2 and up) that still need samples, narrowest first."""
        need = WARMUP_SAMPLES + SAMPLES
        return [i + 1 for i, s in enumerate(self._verify) if i and s.seen < need]

    def observe_verify(self, width: int, seconds: float, context: int = 0) -> None:
        if 1 <= width <= self.widths and seconds > 0:
            self._verify[width - 1].add(seconds, self._clock)
            self._cached = None
            self._context = max(self._context, context)
            self._maybe_report()

    def observe_step(self, seconds: float) -> None:
        """A plain target step: the verification of one token.

        Plain steps run from the reply's first token on, so their kernels are
        built: no sample is a warm-up. While Auto drafts, plain steps come from
        its rare probes only, each measuring the step afresh (:data:`COST_STALE`):
        a median over the steps of a process's first replies held a 27B hybrid's
        step at 39 ms on an H100 where plain decoding ran at 20-38 ms, and Auto
        drafted at 0.73x plain.
        """
        self._clock += 1
        first = self._verify[0]
        first.seen = max(first.seen, WARMUP_SAMPLES)
        self.observe_verify(1, seconds)

    def observe_draft_step(self, seconds: float) -> None:
        if seconds > 0:
            self._draft.add(seconds, self._clock)
            self._cached = None

    @property
    def draft_stale(self) -> bool:
        """Whether the draft step is old enough that its next sample measures it afresh:
        Auto times the next drafting round rather than trust it."""
        return self._draft.value is not None and self._draft.stale(self._clock)

    def observe_round(self, k: int, width: int, seconds: float) -> None:
        """A drafting round of ``k`` draft steps and ``width`` rows took ``seconds``.

        ``seconds`` run from the round's start to the next round's, so they hold
        whatever reads the round too. Beside the draft steps, they are what a
        round at this width costs; what the forward alone does not explain is
        the round's fixed cost, which every other width pays as well.
        """
        self._clock += 1  # whatever it says of its width, it ran: other costs age
        if not 1 <= width <= self.widths or seconds <= 0:
            return
        c = self._draft.value
        if k and c is None:
            return
        rest = seconds - k * (c or 0.0)
        if rest <= 0:
            return
        own = self._rounds[width - 1]
        if own.stale(self._round_clock, ROUND_STALE):
            # Stale: measured afresh, not mixed with what a slow spell left.
            own = self._rounds[width - 1] = Samples(seen=WARMUP_SAMPLES)
        own.add(rest)
        self._round_clock += 1
        own.last = self._round_clock
        if (v := self._verify[width - 1].value) is not None:
            self._overhead.add(max(0.0, rest - v))
        self._cached = None

    def profile(self) -> CostProfile:
        """What is known now, as a value."""
        if self._cached is None:
            rounds = [
                (r, r.settled and not r.stale(self._round_clock, ROUND_STALE)) for r in self._rounds
            ]
            self._cached = CostProfile(
                verify=tuple(s.value for s in self._verify),
                draft_step=self._draft.value,
                context=self._context,
                device=self._device,
                mlx=self._mlx,
                measured_at=time.time(),
                overhead=self._overhead.value or 0.0,
                rounds=tuple(r.value if fresh else None for r, fresh in rounds),
                round_samples=tuple(r.count if fresh else 0 for r, fresh in rounds),
                build=self._build,
            )
        return self._cached

    def replace(self, profile: CostProfile) -> None:
        """Starts again from a fresh measurement (Tune's), and stores it.

        A process that has built its kernels already measures no build: the
        build known before stays.
        """
        profile = replace(profile, build=max(profile.build, self._build))
        self._load(profile)
        self._reported = False
        self._maybe_report()

    def _maybe_report(self) -> None:
        if not self._reported and self.complete and self.on_complete is not None:
            self._reported = True
            try:
                self.on_complete(self.profile())
            except OSError:  # a full disk costs a re-measurement later, nothing more
                log.warning("could not store the cost profile", exc_info=True)


def machine() -> tuple[str, str]:
    """MLX's device and version: half of a profile's key."""
    import mlx.core as mx

    return str(mx.default_device()), getattr(mx, "__version__", "")


def default_store_path() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("Tandem", appauthor=False)) / "profiles.json"


@dataclass
class ProfileStore:
    """Cost profiles on disk, one per (target, draft, device, MLX version).

    Written atomically; a missing or unreadable file reads as empty.
    """

    path: Path = field(default_factory=default_store_path)

    @staticmethod
    def key(target: str, draft: str | None, kind: str = "") -> str:
        """The entry of a pair on this machine: ``kind`` "" is its profile, "batch" its batch's."""
        device, version = machine()
        key = f"{target}|{draft or ''}|{device}|mlx {version}"
        return f"{key}|{kind}" if kind else key

    def get(self, target: str, draft: str | None) -> CostProfile | None:
        """The stored profile of this pair on this machine and MLX version."""
        raw = self.entry(target, draft)
        try:
            return CostProfile.from_dict(raw) if raw is not None else None
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, target: str, draft: str | None, profile: CostProfile) -> None:
        self.put_entry(target, draft, profile.as_dict())

    def entry(self, target: str, draft: str | None, kind: str = "") -> dict[str, Any] | None:
        """The stored entry of ``kind`` for this pair on this machine, as written."""
        raw = read_entries(self.path, FILE_VERSION, "profiles").get(self.key(target, draft, kind))
        return raw if isinstance(raw, dict) else None

    def put_entry(
        self, target: str, draft: str | None, data: dict[str, Any], kind: str = ""
    ) -> None:
        profiles = read_entries(self.path, FILE_VERSION, "profiles")
        profiles[self.key(target, draft, kind)] = data
        write_entries(self.path, FILE_VERSION, "profiles", profiles)


@dataclass(frozen=True, slots=True)
class ProfileProgress:
    """One width of a measurement is done."""

    done: int
    total: int
    text: str


PROFILE_CONTEXT = 512  # cache rows a profile measures its forwards against


def measure_profile(
    target: Any,
    draft: Any | None,
    *,
    widths: int = K_MAX + 1,
    context: int = PROFILE_CONTEXT,
    repeats: int = 2,
    draft_steps: int = 16,
    cancel: Any = None,
) -> Iterator[ProfileProgress | CostProfile]:
    """Measures v(m) for m = 1 … ``widths`` and the draft step c, explicitly.

    The target's cache is filled with ``context`` tokens first, so attention
    costs what a conversation of that length costs. A plain step, v(1), is
    timed as plain decoding runs it, each step queued behind the one before
    (as the probes that refine it time it): a lone forward waited on also
    pays for building its graph, which a queued step hides (30 against 21 ms
    for a 27B-shaped hybrid on an H200, and Auto drafted where plain decoding
    was faster). Each wider width runs once unmeasured (kernels are built),
    then ``repeats`` times; the fastest counts, as it does of the steps'
    runs. How much slower the first forward was is the profile's ``build``.

    Yields:
        A :class:`ProfileProgress` after each width, then the :class:`CostProfile`
        (nothing more once ``cancel`` is set).
    """
    import mlx.core as mx

    from app.engine.caches import new_cache, prefill, rewind

    def cancelled() -> bool:
        return cancel is not None and cancel.is_set()

    vocab = min(vocab_size(target), vocab_size(draft) if draft is not None else vocab_size(target))
    tokens = probe_tokens(vocab, context + widths + 1)
    cache = new_cache(target)
    # The plain steps' tokens end the context, so the widths see ``context`` rows.
    prefill(target, cache, tokens[: max(context - PLAIN_QUEUED, 1)])
    verify: list[float | None] = [queued_step(target, cache, PLAIN_STEPS, PLAIN_RUNS)]
    builds: list[float] = []
    total = widths + (1 if draft is not None else 0)
    yield ProfileProgress(1, total, "one plain step")
    for m in range(2, widths + 1):
        if cancelled():
            return
        x = mx.array(tokens[context : context + m])[None]

        def forward(x: mx.array = x, m: int = m) -> None:
            mx.eval(target(x, cache=cache))
            rewind(cache, m)

        times = timed_runs(forward, 1 + repeats)
        best = min(times[1:])
        verify.append(best)
        builds.append(max(0.0, times[0] - best))
        yield ProfileProgress(m, total, f"verifying {m} tokens")
    step = None
    if draft is not None and not cancelled():
        step = _draft_step(draft, tokens[:context], draft_steps)
        yield ProfileProgress(total, total, "draft step")
    if cancelled():
        return
    device, version = machine()
    yield CostProfile(
        verify=tuple(verify),
        draft_step=step,
        context=context,
        device=device,
        mlx=version,
        measured_at=time.time(),
        build=statistics.median(builds) if builds else 0.0,
    )


def probe_tokens(vocab: int, count: int) -> list[int]:
    """``count`` made-up token ids below ``vocab`` (never 0), spread over it, to time forwards."""
    return [(i * 7919 + 13) % max(vocab - 1, 1) + 1 for i in range(count)]


def timed_runs(run: Callable[[], None], count: int) -> list[float]:
    """Seconds of each of ``count`` calls of ``run``, in order (the first builds kernels)."""
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return times


def vocab_size(model: Any) -> int:
    """The model's vocabulary, from its mlx-lm arguments (256 where it says none)."""
    args = getattr(model, "args", None)
    return int(getattr(args, "vocab_size", 0) or 256)


def _draft_step(draft: Any, context: list[int], steps: int, runs: int = DRAFT_RUNS) -> float:
    """Seconds per step of pipelined greedy draft decoding after ``context``.

    The fastest of ``runs`` runs of ``steps`` steps counts, as for a width's
    forward: a small draft is launch-bound, so a busy host can double one run
    (an 8b:1b profile on the H200 read 7.8 ms where its rounds then drafted at
    3.3 ms, and Auto decoded plainly until a try corrected it).
    """
    from app.engine.caches import new_cache, prefill

    cache = new_cache(draft)
    prefill(draft, cache, context[:-1])
    return queued_step(draft, cache, steps, runs, context[-1])


def queued_step(model: Any, cache: list[Any], steps: int, runs: int, token: int = 1) -> float:
    """Seconds per greedy step of ``model`` on ``cache``, each step queued behind the last.

    Two steps build kernels first; the fastest of ``runs`` runs of ``steps``
    counts. The cache grows by ``2 + steps * runs`` rows.
    """
    import mlx.core as mx

    y = mx.array([token])

    def step(y: mx.array) -> mx.array:
        return mx.argmax(model(y[None], cache=cache)[0, -1:], axis=-1)

    for _ in range(2):  # the first steps build kernels
        y = step(y)
        mx.eval(y)

    def run() -> None:
        nonlocal y
        for _ in range(steps):
            y = step(y)
            mx.async_eval(y)  # queued one ahead, as decoding runs
        mx.eval(y)

    return min(timed_runs(run, max(runs, 1))) / max(steps, 1)
