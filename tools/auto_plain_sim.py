"""Whether Auto stays drafting near break-even: a simulation with run 9's measured costs.

Usage: python3 tools/auto_plain_sim.py [DOUBT]   (default: the engine's own)

Auto plans with the costs of run 9's 70b:1b profile at miss 0.28 (plain steps
at 42 ms, draft steps 5.1 ms, k up to 8); rounds cost 4.5 ms a draft plus 95 ms
(k = 8 took 131 ms there) with 10 % noise. Each draft position is accepted with a
true probability alpha. Prints tok/s and the share of plain tokens for eight
seeds per alpha, beside plain decoding and the best fixed k.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import replace
from pathlib import Path

import app.engine.adaptive as adaptive
from app.engine.adaptive import DraftLength
from app.engine.costs import CostModel, CostProfile

RUN = Path(__file__).parent.parent / "docs/bench/h200-q4-run9-70b-1b-r5-miss0.28.json"
STEP = 0.042  # a pipelined plain step there


def round_seconds(k: int) -> float:
    return k * 0.0045 + 0.095


def simulate(profile: CostProfile, alpha: float, seed: int, tokens: int = 192 * 6) -> tuple:
    rnd = random.Random(seed)
    auto = DraftLength(8, costs=CostModel(9, profile=profile))
    done, plain, seconds = 0, 0, 0.0
    while done < tokens:
        plan = auto.choose()
        if plan.k == 0:
            n = int(plan.tokens)
            done, plain, seconds = done + n, plain + n, seconds + n * STEP
            for _ in range(3):
                auto.costs.observe_step(STEP)
            continue
        accepted = 0
        while accepted < plan.k and rnd.random() < alpha:
            accepted += 1
        auto.observe(plan.k, accepted)
        cost = round_seconds(plan.k)
        done, seconds = done + accepted + 1, seconds + cost
        auto.costs.observe_round(plan.k, plan.width, cost * rnd.uniform(0.9, 1.1))
    return round(done / seconds, 1), round(plain / done, 2)


def main() -> None:
    if len(sys.argv) > 1:
        adaptive.DOUBT = float(sys.argv[1])
    profile = CostProfile.from_dict(json.loads(RUN.read_text())["meta"]["profile"])
    verify = (STEP, *profile.verify[1:])
    profile = replace(profile, verify=verify, draft_step=0.0051)
    print(f"DOUBT = {adaptive.DOUBT}; per seed: (tok/s, share of plain tokens)")
    for alpha in (0.6, 0.66, 0.72, 0.8):
        best = max((1 - alpha ** (k + 1)) / (1 - alpha) / round_seconds(k) for k in range(1, 9))
        runs = [simulate(profile, alpha, seed) for seed in range(8)]
        print(f"alpha {alpha}: plain {1 / STEP:.1f}, best fixed k {best:.1f}, Auto {runs}")


if __name__ == "__main__":
    main()
