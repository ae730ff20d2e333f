"""What an untimed batched round costs beyond its forward, fitted against its draft steps.

Usage: PYTHONPATH=. python3 tools/round_fit.py TRACE.jsonl BENCH.json

The batch prices a round as u(d) + K·c(d) + V(b, m) + o(b) (app/engine/batch_costs.py),
c(d) from rounds timed part by part: those wait for the draft before verifying,
so Python cannot build ahead. Untimed rounds keep the draft queued ahead of the
forward. This takes a ``tandem bench --trace`` trace and the run's JSON (its
learned costs), subtracts each untimed round's V and u, and fits the rest per
sequence count as o + K·c by least squares: where the fitted c is below the timed
one and o above, the timed parts price long drafts too high and Auto plans short.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from app.engine.batch_costs import BatchCosts, BatchProfile, shape
from app.engine.costs import CostModel, CostProfile


def fit(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """(intercept, slope) of the least-squares line through ``points``; None if x is constant."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def main() -> None:
    trace, bench = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    meta = bench["meta"]
    single = CostProfile.from_dict(meta["profile"]) if "profile" in meta else None
    costs = BatchCosts(CostModel(17, single), BatchProfile.from_dict(meta["batch_costs"]))
    rest: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for text in trace.read_text().splitlines():
        r = json.loads(text)
        if r["event"] != "RoundRun" or len(r["ks"]) < 2 or r["timed"]:
            continue
        b, m, steps, drafting = shape(r["ks"])
        v = costs.verify(b, m)
        if v is None:
            continue
        first = costs.catchup(drafting) if steps else 0.0
        rest[b].append((steps, r["seconds"] - v - first))
    print("b  rounds  steps seen        fitted o (ms)  fitted c (ms)  timed c (ms)  learned o (ms)")
    for b, points in sorted(rest.items()):
        line = fit(points)
        seen = ",".join(str(s) for s in sorted({s for s, _ in points}))
        timed = costs.draft_step(b)
        o, c = (f"{1000 * line[0]:13.1f}", f"{1000 * line[1]:13.1f}") if line else ("-", "-")
        t = f"{1000 * timed:12.1f}" if timed is not None else "-"
        print(f"{b:<2} {len(points):>6}  {seen:<16} {o:>13}  {c:>13}  {t:>12}  "
              f"{1000 * costs.overhead(b):14.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
