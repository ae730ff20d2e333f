"""Every batched round of a ``tandem bench --concurrent`` run, as the planner saw it and as it ran.

Usage: python3 tools/batch_trace.py TRACE.jsonl BENCH-ARGS...
       e.g. python3 tools/batch_trace.py out/trace.jsonl --synthetic 70b:1b --bits 4 \
            --dtype bfloat16 --concurrent 1,4,8 --miss 0.1 --ks 15,auto --max-tokens 128

One JSON line per round: the batch it ran in (each of the bench's runs opens a
fresh batch), the draft lengths, whether the planner planned it (Auto with
several requests) and what it expected (tokens, seconds, a try), whether the
round was timed part by part and drafted stacked, the seconds the costs priced
its shape at, the seconds it took, and what each request accepted.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from app.cli import main
from app.engine import batch as batch_module
from app.engine.batch import BatchDecoder
from app.engine.batch_costs import BatchLength, BatchPlan, shape

path, argv = sys.argv[1], sys.argv[2:]
out = open(path, "w")  # noqa: SIM115 (open for the run)
state: dict[str, Any] = {"batch": 0, "plan": None}
real_init, real_round, real_choose = BatchDecoder.__init__, BatchDecoder._round, BatchLength.choose
real_draft = BatchDecoder._draft


def _init(self: BatchDecoder, *args: Any, **kwargs: Any) -> None:
    real_init(self, *args, **kwargs)
    state["batch"] += 1


def _choose(self: BatchLength, wants: Any) -> BatchPlan:
    plan = real_choose(self, wants)
    state["plan"] = plan
    return plan


def _draft(self: BatchDecoder, requests: Any, ks: Any, timed: bool, *rest: Any) -> Any:
    got = real_draft(self, requests, ks, timed, *rest)
    state["timed"], state["stacked"] = timed, got[4]  # the layout it ran
    return got


def _round(self: BatchDecoder, requests: list[Any]) -> None:
    state["plan"] = None
    start = time.perf_counter()
    real_round(self, requests)
    seconds = time.perf_counter() - start
    rounds = [r.out[-1] for r in requests]
    ks = [r.k for r in rounds]
    priced_at = self.batch_costs.round_seconds(*shape(ks)) if len(ks) > 1 else None
    plan: BatchPlan | None = state["plan"]
    row = {
        "batch": state["batch"],
        "b": len(requests),
        "ks": ks,
        "accepted": [r.accepted for r in rounds],
        "auto": any(r.auto for r in rounds),
        "planned": plan is not None,
        "expect_tokens": plan.tokens if plan else None,
        "expect_seconds": plan.seconds if plan else None,
        "explore": plan.explore if plan else None,
        "timed": state.get("timed"),
        "stacked": state.get("stacked"),
        "priced": priced_at,
        "seconds": seconds,
    }
    out.write(json.dumps(row) + "\n")
    out.flush()


BatchDecoder.__init__ = _init  # type: ignore[method-assign]
BatchDecoder._round = _round  # type: ignore[method-assign]
BatchDecoder._draft = _draft  # type: ignore[method-assign, assignment]
BatchLength.choose = _choose  # type: ignore[method-assign]
assert batch_module.BatchDecoder is BatchDecoder
sys.exit(main(["bench", *argv]))
