"""Batched Auto's plans, simulated on a measured batch profile against fixed k.

Usage: PYTHONPATH=. python3 tools/batch_auto_sim.py [PROFILE.json] [--miss 0.1]
       [--streams 1,4,8] [--geometric ALPHA] [--seeds N] [--learn] [--fade-per-request]

The batch's costs are those a run learned (``meta.batch_costs`` and ``meta.profile``
of a ``tandem bench --concurrent`` JSON file); every round costs what they price
its shape at. Each stream walks the synthetic draft's 64-token cycle as
``app/testing/synthetic.py`` builds it (the misses of ``--miss``), each from a
place of its own (the bench's streams differ in their prompt's last token);
``--geometric`` accepts each draft at random instead. As in the bench, the
counts run in turn, each twice, and acceptance carries over from run to run.
With ``--learn`` the planner starts from no batch costs, as the bench's did, and
learns them from its rounds (k = 15's first, then Auto's); ``--fade-per-request``
fades acceptance once per request observed, as the batch did before.

Variants:
  k=N      every stream drafts N.
  auto     the batch's planner (app/engine/batch_costs.py): one k for its Auto streams.
  policy   a candidate: each stream the k of the best stretch policy for where its
           round starts (app/engine/stretch.py), priced as rounds of b streams alike.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

from app.engine.adaptive import Acceptance
from app.engine.batch_costs import BatchCosts, BatchLength, BatchProfile, Want, shape
from app.engine.costs import CostModel, CostProfile
from app.engine.stretch import FRESH, Belief, best_policy

ROOT = Path(__file__).parent.parent
DEFAULT = ROOT / "docs/bench/h200-q4-run16-streams-70b-1b-miss0.1.json"
CYCLE = 64
TOKENS = 128
K_MAX = 15


def along_stretches(
    costs: BatchCosts,
    acceptance: Acceptance,
    ks: list[int],
    beliefs: list[Belief],
    rooms: list[int],
) -> list[int]:
    """Each stream's k from the best stretch policy, priced as rounds of b streams alike."""
    b, top = len(ks), max(rooms)
    if not any(ks) or top == 0:
        return ks
    seconds = [0.0]
    for k in range(1, top + 1):
        price = costs.round_seconds(b, k + 1, k, b)
        assert price is not None
        seconds.append(price / b)
    rates = acceptance.stretch_rates()[: 2 * (top + 1)]
    policy = best_policy(rates, seconds, top)
    k_now = max(ks)
    if policy.rate < 1.01 * policy.same[k_now]:
        return ks
    return [min(policy.k(x), r) for x, r in zip(beliefs, rooms, strict=True)]


def costs_of(path: Path) -> BatchCosts:
    meta = json.loads(path.read_text())["meta"]
    single = CostProfile.from_dict(meta["profile"]) if meta.get("profile") else None
    return BatchCosts(CostModel(17, profile=single), BatchProfile.from_dict(meta["batch_costs"]))


def accepted_fn(
    miss: float, geometric: float | None, rng: random.Random
) -> Callable[[int, int], int]:
    """How many of k drafts from cycle place p are accepted."""
    if geometric is not None:
        return lambda _p, k: next((j for j in range(k) if rng.random() > geometric), k)
    missed = set(random.Random(1).sample(range(CYCLE), round(miss * CYCLE)))  # the draft's seed
    return lambda p, k: next((j for j in range(k) if (p + j) % CYCLE in missed), k)


def teach(learned: BatchCosts, truth: BatchCosts, ks: list[int], timed: bool) -> None:
    """What the batch would have measured of a round of ``ks`` that cost what ``truth`` says."""
    b, m, steps, d = shape(ks)
    stacked = learned.stacks(d)
    layout = truth._draft[stacked].get(d)
    step = layout.value if layout is not None and layout.value is not None else None
    step = step if step is not None else truth.draft_step(d) or 0.0
    catchup = truth._catchup_in(stacked, d)
    verify = truth.verify(b, m) or 0.0
    draft = catchup + steps * step if steps else 0.0
    if timed:
        first = catchup + step if steps else None
        learned.observe_parts(b, m, steps, d, draft, verify, first, stacked)
    else:
        learned.observe_round(b, m, steps, d, draft + verify + truth.overhead(b))


def simulate(
    costs: BatchCosts,
    variant: str,
    streams: int,
    accept: Callable[[int, int], int],
    acceptance: Acceptance,
    offsets: list[int],
    learned: BatchCosts | None = None,
    per_round: bool = True,
) -> tuple[float, float]:
    """(total tokens per second, mean k of drafting rounds) of one batch of streams.

    ``costs`` price every round; with ``learned``, the planner plans from those
    instead, and they learn from each round as the batch's own costs do.
    ``per_round``: a round fades acceptance once, as the batch does (else once per request).
    """
    planner = BatchLength(learned or costs)
    place = offsets[:streams]
    made = [0] * streams
    belief: list[Belief] = [FRESH] * streams
    seconds, ks_seen = 0.0, []
    while min(made) < TOKENS:
        live = [i for i in range(streams) if made[i] < TOKENS]
        rooms = [max(0, min(TOKENS - made[i] - 1, K_MAX)) for i in live]
        if variant.startswith("k="):
            ks = [min(int(variant[2:]), r) for r in rooms]
            timed = learned is not None and learned.wants_timing(*shape(ks)[:2], shape(ks)[3])
        else:
            wants = [Want(acceptance, r) for r in rooms]
            plan = planner.choose(wants)
            ks, timed = list(plan.ks), plan.timed
            if variant == "policy" and not plan.explore:
                ks = along_stretches(costs, acceptance, ks, [belief[i] for i in live], rooms)
        if learned is not None and len(ks) > 1:
            teach(learned, costs, ks, timed)
        price = costs.round_seconds(*shape(ks))
        assert price is not None
        seconds += price
        share = 1.0 / max(1, sum(1 for k in ks if k)) if per_round else 1.0
        for i, k in zip(live, ks, strict=True):
            n = accept(place[i], k) if k else 0
            if k:
                belief[i] = acceptance.observe_stretch(belief[i], k, n, share)
                ks_seen.append(k)
            else:
                belief[i] = FRESH
            place[i] = (place[i] + n + 1) % CYCLE
            made[i] += n + 1
    return sum(made) / seconds, sum(ks_seen) / max(1, len(ks_seen))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profile", nargs="?", default=str(DEFAULT))
    ap.add_argument("--miss", type=float, default=0.1)
    ap.add_argument("--streams", default="1,4,8")
    ap.add_argument("--geometric", type=float, default=None)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--learn",
        action="store_true",
        help="as run 16 ran: k = 15, then Auto, on costs learned from their rounds from scratch",
    )
    ap.add_argument(
        "--fade-per-request",
        action="store_true",
        help="acceptance fades once per request observed, as the batch did before",
    )
    args = ap.parse_args()
    variants = ["k=15", "auto"] if args.learn else ["k=7", "k=13", "k=15", "auto", "policy"]
    print(f"{'streams':>7} " + " ".join(f"{v:>14}" for v in variants))
    counts = [int(x) for x in args.streams.split(",")]
    table: dict[str, list[list[tuple[float, float]]]] = {v: [] for v in variants}
    for seed in range(args.seeds):
        rng = random.Random(seed)
        offsets = [rng.randrange(CYCLE) for _ in range(max(counts))]
        truth = costs_of(Path(args.profile))
        # As the bench: one cost model for the pair through every run (--learn).
        learned = BatchCosts(truth.single) if args.learn else None
        for v in variants:
            # As the bench: acceptance carries over from run to run, each count run twice.
            acceptance = Acceptance()
            runs = []
            for b in counts:
                accept = accepted_fn(args.miss, args.geometric, rng)
                for _ in range(2):
                    got = simulate(
                        truth, v, b, accept, acceptance, offsets, learned, not args.fade_per_request
                    )
                runs.append(got)
            table[v].append(runs)
    for i, b in enumerate(counts):
        cells = []
        for v in variants:
            tps = sum(r[i][0] for r in table[v]) / args.seeds
            k = sum(r[i][1] for r in table[v]) / args.seeds
            cells.append(f"{tps:8.1f} ({k:4.1f})")
        print(f"{b:>7} " + " ".join(f"{c:>14}" for c in cells))


if __name__ == "__main__":
    main()
