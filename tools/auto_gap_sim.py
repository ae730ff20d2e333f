"""Auto against fixed k on the synthetic draft's miss pattern, with run 10's measured costs.

Usage: PYTHONPATH=. python3 tools/auto_gap_sim.py

The synthetic draft misses at fixed places of its 64-token cycle (seed 1), so
tokens per round are a step function of k. Rounds cost k draft steps (4.4 ms)
plus the profile's verification at the round's width, with 5 % noise; replies
of 192 tokens start at the cycle's start, as the bench's do. Prints tok/s of
fixed k = 11 to 14 and of Auto over four replies.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from app.engine.adaptive import DraftLength
from app.engine.costs import CostModel, CostProfile
from app.testing.synthetic import cycle_length

RUN = Path(__file__).parent.parent / "docs/bench/h200-q4-run10-32b-0.5b-doubt-miss0.1.json"
DRAFT_STEP = 0.0044  # what the run's rounds learned
REPLY = 192


def simulate(profile: CostProfile, misses: set[int], fixed: int | None, seed: int = 0) -> float:
    rnd = random.Random(seed)
    length = cycle_length("32b")
    auto = DraftLength(15, fixed=fixed, costs=CostModel(16, profile=profile))
    tokens, seconds = 0, 0.0
    for _ in range(4):
        pos = done = 0
        while done < REPLY:
            plan = auto.choose()
            k = min(plan.k, REPLY - done - 1)
            accepted = 0
            while accepted < k and (pos + accepted) % length not in misses:
                accepted += 1
            auto.observe(k, accepted)
            verify = profile.verify[plan.width - 1]
            assert verify is not None  # the profile measured every width
            cost = k * DRAFT_STEP + verify
            auto.costs.observe_round(k, plan.width, cost * rnd.uniform(0.95, 1.05))
            pos, done, seconds = pos + accepted + 1, done + accepted + 1, seconds + cost
        tokens += done
    return tokens / seconds


def main() -> None:
    profile = CostProfile.from_dict(json.loads(RUN.read_text())["meta"]["profile"])
    length = cycle_length("32b")
    misses = set(random.Random(1).sample(range(length), round(0.1 * length)))
    ordered = sorted(misses)
    gaps = [(ordered[(i + 1) % len(ordered)] - m) % length for i, m in enumerate(ordered)]
    print(f"misses at {ordered} of {length}: gaps {gaps}")
    for k in (11, 12, 13, 14):
        print(f"fixed k = {k}: {simulate(profile, misses, k):.1f} tok/s")
    runs = [round(simulate(profile, misses, None, seed), 1) for seed in range(4)]
    print(f"Auto (four seeds of round noise): {runs} tok/s")


if __name__ == "__main__":
    main()
