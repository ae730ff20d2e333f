"""Auto that knows where a round starts, simulated against the Auto before it and fixed k.

Usage: PYTHONPATH=. python3 tools/auto_state_sim.py [--wide] [SCENARIO ...]
       VARIANTS=current,stretch SEEDS=32 ... to run only some controllers, more seeds

"stretch" is the engine's Auto as the single decoder runs it, with the stream's
belief over where its next round starts (app/engine/stretch.py); "current" is
the same Auto without a belief, as it ran before (and as the batch runs it).

Also here, for the record: "2-state" (tables per previous outcome, the best
pair of the two-state chain: the value of a state depends on the k that led
there, so it misjudges the periodic pattern) and "checked" (the model's top
candidates checked against realised tokens per round, in blocks: 768 tokens
are too few for it), and "stretch-seen" (the variant with each round's
evidence put at the distance it seems to start at, no belief).

Simulation as tools/auto_gap_sim.py: four replies of 192 tokens per seed,
rounds cost k draft steps plus the verification of their width, Auto observes
them with 5 % noise. Acceptance draws are common to all controllers of a seed.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from app.engine.adaptive import PRIOR_WEIGHT, Acceptance, DraftLength
from app.engine.costs import K_MAX, CostModel, CostProfile, Plan, plan_round
from app.engine.stretch import FRESH, Belief, best_policy
from app.testing.synthetic import cycle_length

ROOT = Path(__file__).parent.parent
REPLY = 192
REPLIES = 4

# --------------------------------------------------------------------------------------
# The variant: the engine's Auto with a stretch belief per stream (app/engine/stretch.py).
# --------------------------------------------------------------------------------------


def round_seconds(profile: CostProfile, k_max: int, width: int | None) -> list[float] | None:
    """Seconds of a round of k drafts for k = 0 … k_max (index k), as ``plan_round`` prices them."""
    c = profile.draft_step or 0.0
    seconds = [0.0]
    for k in range(1, k_max + 1):
        padded = profile.padded_round(k + 1, width)
        if padded is None:
            return None
        seconds.append(k * c + padded[0])
    return seconds


class StretchDraftLength(DraftLength):
    """The engine's Auto, given the stream's belief as the single decoder gives it.

    A reply starts a stretch (:meth:`reset`).
    """

    def __init__(self, k_max: int = 8, costs: CostModel | None = None) -> None:
        super().__init__(k_max, None, costs)
        self.belief: Belief = FRESH

    def reset(self) -> None:
        self.belief = FRESH

    def choose(self, belief: Belief | None = None) -> Plan:
        return super().choose(self.belief)

    def observe(  # type: ignore[override]  # its belief is its own, never None
        self, k: int, accepted: int, belief: Belief | None = None, share: float = 1.0
    ) -> Belief:
        self.belief = super().observe(k, accepted, self.belief, share)
        return self.belief


class SeenStretchDraftLength(StretchDraftLength):
    """Ablation: a round's evidence goes to the distance it seems to start at (no belief)."""

    def observe(  # type: ignore[override]  # its belief is its own, never None
        self, k: int, accepted: int, belief: Belief | None = None, share: float = 1.0
    ) -> Belief:
        acc = self.acceptance
        ((start, _),) = self.belief
        acc.observe_stretch(((start, 1.0),), k, accepted)
        if k > 0:
            far = min(start + k + 1, acc.stretch.distances - 1)
            self.belief = ((far, 1.0),) if accepted >= k else FRESH
        return self.belief


# --------------------------------------------------------------------------------------
# Alternatives tried
# --------------------------------------------------------------------------------------

MISS, BONUS = 0, 1  # how the previous round ended: a rejection, or every draft accepted


class StateAcceptance(Acceptance):
    """Acceptance pooled (as :class:`Acceptance`) and per start state.

    A round starting after a rejection starts a fresh stretch; one starting
    after a full acceptance goes on from where that one stopped. Each state's
    table leans on the pooled one where it has seen little (:data:`PRIOR_WEIGHT`
    rounds' worth), so with no difference between the states it is the pooled
    table, and Auto is the current one.
    """

    def __init__(self, positions: int = K_MAX, decay: float = 0.98) -> None:
        super().__init__(positions, decay)
        self._state_reached = [[0.0] * positions for _ in (MISS, BONUS)]
        self._state_accepted = [[0.0] * positions for _ in (MISS, BONUS)]

    def state_rates(self, state: int, pooled: tuple[float, ...]) -> tuple[float, ...]:
        """Acceptance at each position of a round that starts in ``state``."""
        reached, accepted = self._state_reached[state], self._state_accepted[state]
        return tuple(
            min((a + p * PRIOR_WEIGHT) / (r + PRIOR_WEIGHT), 0.999)
            for r, a, p in zip(reached, accepted, pooled, strict=True)
        )

    def observe_state(self, state: int, k: int, accepted: int) -> None:
        """A round that started in ``state`` proposed ``k`` and kept ``accepted``."""
        self.observe(k, accepted)
        if k <= 0:
            return
        d = self.decay
        for s in (MISS, BONUS):  # both fade with every round, as the pooled table does
            reached, acc = self._state_reached[s], self._state_accepted[s]
            for i in range(len(reached)):
                reached[i] *= d
                acc[i] *= d
        reached, acc = self._state_reached[state], self._state_accepted[state]
        for i in range(min(k, accepted + 1, len(reached))):
            reached[i] += 1.0
            if i < accepted:
                acc[i] += 1.0


def _curves(rates: tuple[float, ...], k_max: int) -> tuple[list[float], list[float]]:
    """E(k) and P(all k accepted) for k = 0 … k_max (see expected_tokens)."""
    tokens, full = [1.0], [1.0]
    total = survive = 1.0
    for i in range(k_max):
        survive *= rates[min(i, len(rates) - 1)]
        total += survive
        tokens.append(total)
        full.append(survive)
    return tokens, full


def best_pair(
    miss: tuple[float, ...], bonus: tuple[float, ...], seconds: list[float], k_max: int
) -> tuple[int, int, float]:
    """(k after a miss, k after a bonus, rate) of the best stationary two-state policy.

    From state s a round of k_s commits E_s(k_s) tokens in T(k_s) seconds and
    leaves the chain in "bonus" with chance P_s(k_s) (all accepted), else in
    "miss". Its long-run rate is Σ π_s E_s / Σ π_s T_s over the chain's
    stationary π: π_bonus = P_m / (P_m + 1 - P_b).

    Args:
        seconds: ``seconds[k]``: a round of k drafts (index 0 unused).
    """
    e_m, p_m = _curves(miss, k_max)
    e_b, p_b = _curves(bonus, k_max)
    best = (1, 1, -1.0)
    for km in range(1, k_max + 1):
        pm, em, tm = p_m[km], e_m[km], seconds[km]
        for kb in range(1, k_max + 1):
            # Weights π_m ∝ 1 - P_b, π_b ∝ P_m (normalisation cancels in the ratio).
            wm, wb = 1.0 - p_b[kb], pm
            rate = (wm * em + wb * e_b[kb]) / (wm * tm + wb * seconds[kb])
            if rate > best[2]:
                best = (km, kb, rate)
    return best


class StateDraftLength(DraftLength):
    """The current Auto, with k chosen per start state from the best two-state policy."""

    def __init__(self, k_max: int = 8, costs: CostModel | None = None) -> None:
        super().__init__(k_max, None, costs, StateAcceptance())
        self.state = MISS  # a reply starts afresh (its first token is the target's)
        self.pair: tuple[int, int] = (0, 0)

    def reset(self) -> None:
        """A new reply: its first round starts a fresh stretch."""
        self.state = MISS

    def _choose(self) -> Plan:
        plan = super()._choose()
        if plan.k == 0 or plan.explore or self.costs.missing():
            return plan  # plain, a try, or measuring a width: as the current Auto
        profile = self.costs.profile()
        acc = self.acceptance
        assert isinstance(acc, StateAcceptance)
        pooled = acc.rates()
        seconds = round_seconds(profile, self.k_max, self._width)
        if seconds is None:
            return plan
        km, kb, _ = best_pair(
            acc.state_rates(MISS, pooled), acc.state_rates(BONUS, pooled), seconds, self.k_max
        )
        self.pair = (km, kb)
        k = km if self.state == MISS else kb
        if k == plan.k:
            return plan
        rates = acc.state_rates(self.state, pooled)
        return plan_round(profile, rates, self.k_max, k, keep=self._width) or plan

    def observe(self, k: int, accepted: int) -> None:  # type: ignore[override]  # no belief
        acc = self.acceptance
        assert isinstance(acc, StateAcceptance)
        acc.observe_state(self.state, k, accepted)
        if k > 0:
            self.state = BONUS if accepted >= k else MISS


MARGIN = 0.05  # of the model's best rate: k within it are candidates
CANDIDATES = 3  # at most this many, the model's best first
CHECK_WEIGHT = 2.0  # rounds of evidence the model's tokens per round are worth beside realised ones
CHALLENGE_EVERY = 16  # fewest rounds between two blocks of a candidate short of evidence
BLOCK = 6  # rounds a chosen k runs before the choice is made again
SHORT = 3.0  # (faded) rounds of evidence below which a candidate is challenged


class CheckedDraftLength(DraftLength):
    """The current Auto, with its top candidates checked against realised tokens per round.

    The model (per-position acceptance, measured costs) proposes; what rounds
    of each candidate k really committed disposes. A round counts for its k
    only if the round before it ran the same k, so it started where rounds of
    that k start (after a full acceptance, mid-stretch); k then runs in blocks.
    Seconds stay the model's (they are measured per width already): what the
    model misses is where rounds start, which shows in tokens per round.
    """

    def __init__(self, k_max: int = 8, costs: CostModel | None = None) -> None:
        super().__init__(k_max, None, costs, Acceptance())
        n = self.k_max + 1
        self._tokens = [0.0] * n  # faded tokens of counted rounds, per k
        self._rounds = [0.0] * n  # faded counted rounds, per k
        self._prev = 0  # k of the last round, 0 after a try or a plain burst
        self._block_k = 0
        self._block_left = 0
        self._since_challenge = 0

    def _choose(self) -> Plan:
        plan = super()._choose()
        if plan.k == 0 or plan.explore or self.costs.missing():
            if plan.k == 0 or plan.explore:
                self._prev = 0
            return plan
        profile = self.costs.profile()
        rates = self.acceptance.rates()
        c = profile.draft_step or 0.0
        model: list[tuple[float, int, float, float]] = []  # (rate, k, tokens, seconds)
        total = survive = 1.0
        for k in range(1, self.k_max + 1):
            survive *= rates[min(k - 1, len(rates) - 1)]
            total += survive
            padded = profile.padded_round(k + 1, self._width)
            if padded is None:
                return plan
            seconds = k * c + padded[0]
            model.append((total / seconds, k, total, seconds))
        model.sort(reverse=True)
        top = model[0][0]
        cands = [m for m in model[:CANDIDATES] if m[0] >= (1.0 - MARGIN) * top]
        self._since_challenge += 1
        if self._block_left > 0 and any(m[1] == self._block_k for m in cands):
            self._block_left -= 1
            k = self._block_k
        else:

            def score(m: tuple[float, int, float, float]) -> float:
                _, k, tokens, seconds = m
                seen = (self._tokens[k] + CHECK_WEIGHT * tokens) / (self._rounds[k] + CHECK_WEIGHT)
                return seen / seconds

            k = max(cands, key=score)[1]
            short = [m[1] for m in cands if m[1] != k and self._rounds[m[1]] < SHORT]
            if short and self._since_challenge >= CHALLENGE_EVERY:
                k, self._since_challenge = short[0], 0
            self._block_k, self._block_left = k, BLOCK - 1
        if k == plan.k:
            return plan
        return plan_round(profile, rates, self.k_max, k, keep=self._width) or plan

    def observe(self, k: int, accepted: int) -> None:  # type: ignore[override]  # no belief
        super().observe(k, accepted)
        if k <= 0:
            return
        for i in range(len(self._rounds)):
            self._tokens[i] *= self.acceptance.decay
            self._rounds[i] *= self.acceptance.decay
        if k == self._prev and k < len(self._rounds):
            self._tokens[k] += accepted + 1
            self._rounds[k] += 1.0
        self._prev = k


# --------------------------------------------------------------------------------------
# Simulation
# --------------------------------------------------------------------------------------


def load(name: str) -> CostProfile:
    return CostProfile.from_dict(
        json.loads((ROOT / "docs/bench" / name).read_text())["meta"]["profile"]
    )


@dataclass(frozen=True)
class Scenario:
    name: str
    profile: CostProfile  # what Auto starts from
    verify: tuple[float, ...]  # what widths really cost (index width - 1)
    draft_step: float  # what a draft step really costs
    k_max: int
    source: Callable[[random.Random], Callable[[int], bool]]  # per reply: index -> accepted?
    ks: tuple[int, ...]  # fixed k to print


def periodic(misses: set[int], length: int) -> Callable[[random.Random], Callable[[int], bool]]:
    def make(_: random.Random) -> Callable[[int], bool]:
        return lambda i: i % length not in misses

    return make


def iid(alpha: float) -> Callable[[random.Random], Callable[[int], bool]]:
    def make(rnd: random.Random) -> Callable[[int], bool]:
        draws = [rnd.random() < alpha for _ in range(4 * REPLY)]
        return draws.__getitem__

    return make


def bursty(
    easy: float = 0.95, hard: float = 0.4, switch: float = 0.05
) -> Callable[[random.Random], Callable[[int], bool]]:
    """Acceptance in easy and hard stretches: a hidden state that flips with ``switch`` a token."""

    def make(rnd: random.Random) -> Callable[[int], bool]:
        state, draws = rnd.random() < 0.5, []
        for _ in range(4 * REPLY):
            if rnd.random() < switch:
                state = not state
            draws.append(rnd.random() < (easy if state else hard))
        return draws.__getitem__

    return make


def simulate(
    scn: Scenario, make: Callable[[CostModel], DraftLength], seed: int
) -> tuple[float, list[int]]:
    """Tokens per second over REPLIES replies, and the k of every drafting round."""
    rnd = random.Random(seed)
    model = CostModel(scn.k_max + 1, profile=scn.profile)
    auto = make(model)
    tokens, seconds, ks = 0, 0.0, []
    for reply in range(REPLIES):
        accepts = scn.source(random.Random(f"{seed}-{reply}"))  # common to all controllers
        if hasattr(auto, "reset"):
            auto.reset()
        pos = done = 0
        while done < REPLY:
            plan = auto.choose()
            if plan.k == 0:  # a plain burst
                n = min(max(1, round(plan.tokens)), REPLY - done)
                step = scn.verify[0]
                for _ in range(min(n, 3)):
                    model.observe_step(step * rnd.uniform(0.95, 1.05))
                pos, done, seconds = pos + n, done + n, seconds + n * step
                continue
            k = min(plan.k, max(1, REPLY - done - 1))
            accepted = 0
            while accepted < k and accepts(pos + accepted):
                accepted += 1
            timed = plan.width in model.missing()
            auto.observe(k, accepted)
            verify = scn.verify[plan.width - 1]
            cost = k * scn.draft_step + verify
            if timed:  # as the engine: a round at an unmeasured width times its forward
                model.observe_verify(plan.width, verify * rnd.uniform(0.95, 1.05))
            else:
                model.observe_round(k, plan.width, cost * rnd.uniform(0.95, 1.05))
            ks.append(k)
            pos, done, seconds = pos + accepted + 1, done + accepted + 1, seconds + cost
        tokens += done
    return tokens / seconds, ks


def synthetic_misses(miss: float, draft: str) -> set[int]:
    """The synthetic draft's misses: as app.testing.synthetic.build (seed 1, as the bench)."""
    length = cycle_length(draft)
    return set(random.Random(1).sample(range(length), round(miss * length)))


def scenarios() -> dict[str, Scenario]:
    p32 = load("h200-q4-run10-32b-0.5b-doubt-miss0.1.json")
    p70 = load("h200-q4-run10-70b-1b-miss0.1.json")
    v32 = tuple(v for v in p32.verify if v is not None)
    v70 = tuple(v for v in p70.verify if v is not None)
    cpu_measured = (0.639, 0.793, 0.904, 0.889, 1.031, 1.216)
    cpu = CostProfile(verify=(*cpu_measured, *([None] * 11)), draft_step=0.262)
    vcpu = tuple(cpu.estimate(m) or 0.0 for m in range(1, 18))
    # Both drafts (0.5b, 1b) have a 64-token cycle, so both miss at the same places.
    m32 = synthetic_misses(0.1, "0.5b")
    m70 = synthetic_misses(0.1, "1b")
    gpu = tuple(range(1, 16))
    out = [
        Scenario(
            "32b:0.5b miss 0.1", p32, v32, 0.0044, 15, periodic(m32, cycle_length("0.5b")), gpu
        ),
        Scenario("70b:1b miss 0.1", p70, v70, 0.0029, 15, periodic(m70, cycle_length("1b")), gpu),
        Scenario("70b:1b miss 0", p70, v70, 0.0029, 15, periodic(set(), 64), gpu),
    ]
    for alpha in (0.7, 0.85):
        out.append(Scenario(f"32b iid {alpha}", p32, v32, 0.0044, 15, iid(alpha), gpu))
        out.append(Scenario(f"70b iid {alpha}", p70, v70, 0.0029, 15, iid(alpha), gpu))
    out.append(Scenario("32b bursty", p32, v32, 0.0044, 15, bursty(), gpu))
    out.append(Scenario("70b bursty", p70, v70, 0.0029, 15, bursty(), gpu))
    out.append(Scenario("cpu iid 0.75", cpu, vcpu, 0.262, 8, iid(0.75), tuple(range(1, 9))))
    out.append(Scenario("cpu bursty", cpu, vcpu, 0.262, 8, bursty(), tuple(range(1, 9))))
    return {s.name: s for s in out}


def wide() -> dict[str, Scenario]:
    """Beyond the brief's scenarios: other miss patterns and acceptance shapes."""
    base = scenarios()
    s32, s70 = base["32b iid 0.7"], base["70b iid 0.7"]
    out = []
    for seed in (2, 3, 4, 5):
        for miss in (0.05, 0.2, 0.28):
            length = 64
            misses = set(random.Random(seed).sample(range(length), round(miss * length)))
            for s, tag in ((s32, "32b"), (s70, "70b")):
                out.append(
                    replace(
                        s, name=f"{tag} seed {seed} miss {miss}", source=periodic(misses, length)
                    )
                )
    for alpha in (0.5, 0.6, 0.95):
        for s, tag in ((s32, "32b"), (s70, "70b")):
            out.append(replace(s, name=f"{tag} iid {alpha}", source=iid(alpha)))
    for easy, hard, switch in ((0.9, 0.2, 0.02), (0.95, 0.5, 0.1), (0.98, 0.6, 0.03)):
        for s, tag in ((s32, "32b"), (s70, "70b")):
            name = f"{tag} bursty {easy}/{hard}/{switch}"
            out.append(replace(s, name=name, source=bursty(easy, hard, switch)))
    return {s.name: s for s in out}


def fixed(k: int) -> Callable[[CostModel], DraftLength]:
    return lambda costs: DraftLength(costs.widths - 1, fixed=k, costs=costs)


VARIANTS: dict[str, Callable[[CostModel], DraftLength]] = {
    "current": lambda costs: DraftLength(costs.widths - 1, costs=costs),
    "2-state": lambda costs: StateDraftLength(costs.widths - 1, costs=costs),
    "checked": lambda costs: CheckedDraftLength(costs.widths - 1, costs=costs),
    "stretch-seen": lambda costs: SeenStretchDraftLength(costs.widths - 1, costs=costs),
    "stretch": lambda costs: StretchDraftLength(costs.widths - 1, costs=costs),
}


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def main() -> None:
    args = sys.argv[1:]
    table, seeds = scenarios(), range(int(os.environ.get("SEEDS", 8)))
    if args and args[0] == "--wide":
        table, args, seeds = wide(), args[1:], range(int(os.environ.get("SEEDS", 4)))
    names = os.environ.get("VARIANTS", ",".join(VARIANTS)).split(",")
    variants = {v: VARIANTS[v] for v in names}
    rows = []
    for name, scn in table.items():
        if args and not any(w in name for w in args):
            continue
        fixed_rates = {k: mean([simulate(scn, fixed(k), s)[0] for s in seeds]) for k in scn.ks}
        best_k = max(fixed_rates, key=fixed_rates.__getitem__)
        best = fixed_rates[best_k]
        print(f"\n{name}: fixed k " + " ".join(f"{k}:{r:.1f}" for k, r in fixed_rates.items()))
        runs = {v: [simulate(scn, make, s) for s in seeds] for v, make in variants.items()}
        for v, got in runs.items():
            r = mean([x for x, _ in got])
            mk = mean([mean([float(k) for k in ks]) for _, ks in got])
            print(
                f"  {v:12s} {r:7.2f} ({r / best:.3f} of fixed {best_k}) mean k {mk:4.1f}  seeds "
                + " ".join(f"{x:.1f}" for x, _ in got)
            )
        paired = ""
        if "current" in runs and "stretch" in runs:  # per-seed ratios: the noise of the comparison
            q = [a[0] / b[0] for a, b in zip(runs["stretch"], runs["current"], strict=True)]
            m = mean(q)
            se = math.sqrt(sum((x - m) ** 2 for x in q) / max(1, len(q) - 1) / len(q))
            paired = f"{m:.3f}±{se:.3f}"
        rows.append((name, best_k, best, [mean([x for x, _ in g]) for g in runs.values()], paired))
    print(
        f"\n{'scenario':26s} {'best fixed':>10s} "
        + " ".join(f"{v:>12s}" for v in variants)
        + "  "
        + " ".join(f"{v[:7] + '/best':>12s}" for v in variants)
        + "  stretch/current"
    )
    for name, best_k, best, rs, paired in rows:
        print(
            f"{name:26s} {best_k:2d}:{best:7.2f} "
            + " ".join(f"{r:12.2f}" for r in rs)
            + "  "
            + " ".join(f"{r / best:12.3f}" for r in rs)
            + f"  {paired}"
        )
    timing(variants)


def timing(variants: dict[str, Callable[[CostModel], DraftLength]]) -> None:
    """What a choice costs: choose + observe, and the stretch plan alone."""
    scn = scenarios()["32b bursty"]
    for v, make in variants.items():
        auto = make(CostModel(16, profile=scn.profile))
        for i in range(200):
            auto.choose()
            auto.observe(12, i % 14)
        best = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            for i in range(200):
                auto.choose()
                auto.observe(12, i % 14)
            best = min(best, (time.perf_counter() - t0) / 200)
        print(f"{v}: {best * 1e3:.3f} ms per choose + observe (k_max 15)")
    rates, seconds = [0.8] * 32, [0.0] + [0.05 + 0.004 * k for k in range(1, 16)]
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(200):
            best_policy(rates, seconds, 15)
        best = min(best, (time.perf_counter() - t0) / 200)
    print(f"best_policy alone: {best * 1e3:.3f} ms (k_max 15, 32 distances)")


if __name__ == "__main__":
    main()
