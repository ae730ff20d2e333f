"""Where a batched round's first draft step spends its time, on the machine it runs on.

Usage: python3 tools/first_step_probe.py [pair] [streams]   (default 8b:1b, 8; 4-bit, bfloat16)

Runs ``streams`` greedy requests at k = 15 on one batch, every round timed,
once with the draft's later steps packed and once stacked, and prints the
medians of each part of a round: the plan, the first draft step (it feeds
what the last round committed), a later step, the verification. Then times
the first step's forward alone on caches of the same lengths, packed, with
1 and 2 new tokens each and with each attention mode.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from app.engine import attention
from app.engine.batch import BatchDecoder, take_turns
from app.engine.batch_costs import BatchCosts
from app.engine.packed import packed_forward
from app.engine.speculative import prefill
from app.engine.types import GenerationParams
from app.testing import synthetic

pair = sys.argv[1] if len(sys.argv) > 1 else "8b:1b"
streams = int(sys.argv[2]) if len(sys.argv) > 2 else 8
t_shape, d_shape = synthetic.parse_pair(pair)
target = synthetic.build(t_shape, bits=4, dtype=mx.bfloat16)
vocab = target.args.vocab_size
draft = synthetic.build(d_shape, bits=4, dtype=mx.bfloat16, vocab_size=vocab)
cycle = synthetic.prompt(t_shape, repeats=1)
prompts = [(cycle * 8)[: 400 + 37 * i] for i in range(streams)]

marks: dict[str, float] = {}
rows: list[dict[str, float]] = []
real_round, real_plan, real_draft = BatchDecoder._round, BatchDecoder._plan, BatchDecoder._draft
real_parts = BatchCosts.observe_parts


def _round(self: BatchDecoder, requests: list[Any]) -> None:
    marks["start"] = time.perf_counter()
    real_round(self, requests)


def _plan(self: BatchDecoder, requests: list[Any]) -> tuple[list[int], bool, int]:
    out = real_plan(self, requests)
    marks["planned"] = time.perf_counter()
    return out[0], True, out[2]  # every round timed


def _draft(self: BatchDecoder, *args: Any) -> Any:
    marks["drafting"] = time.perf_counter()
    return real_draft(self, *args)


def _parts(
    self: BatchCosts,
    b: int,
    m: int,
    steps: int,
    drafting: int,
    draft: float,
    verify: float,
    first: float | None = None,
    stacked: bool = False,
) -> None:
    if first is not None and steps > 1:
        step0 = marks["start"] + first - marks["drafting"]
        rows.append(
            {
                "plan": marks["planned"] - marks["start"],
                "before": marks["drafting"] - marks["planned"],
                "first": step0,
                "step": (draft - first) / (steps - 1),
                "verify": verify,
            }
        )
    real_parts(self, b, m, steps, drafting, draft, verify, first, stacked)


def _stacks(stack: bool, d: int) -> bool:
    return stack and d > 1


BatchDecoder._round = _round  # type: ignore[method-assign]
BatchDecoder._plan = _plan  # type: ignore[method-assign]
BatchDecoder._draft = _draft  # type: ignore[method-assign, assignment]
BatchCosts.observe_parts = _parts  # type: ignore[method-assign]

for stack in (False, True, False, True):
    batch = BatchDecoder(target, draft)
    batch.batch_costs.stacks = functools.partial(_stacks, stack)  # type: ignore[method-assign]
    rows.clear()
    params = GenerationParams(num_draft=15, max_tokens=160)
    take_turns([batch.generate(p, params) for p in prompts], 160)
    got = {k: statistics.median(r[k] for r in rows[2:]) * 1e3 for k in rows[0]}
    cells = "  ".join(f"{k} {v:.1f}" for k, v in got.items())
    print(f"{'stacked' if stack else 'packed '} {streams} streams, ms: {cells}", flush=True)

caches = [make_prompt_cache(draft) for _ in prompts]
for cache, p in zip(caches, prompts, strict=True):
    prefill(draft, cache, p)
for mode in ("bucketed", "sdpa", "matmul"):
    attention.set_mode(mode)
    for n in (1, 2, 3):
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            mx.eval(packed_forward(draft, [cycle[:n]] * len(caches), caches))
            times.append(time.perf_counter() - t0)
            for cache in caches:
                trim_prompt_cache(cache, n)
        ms = statistics.median(times[2:]) * 1e3
        print(f"first step alone, {mode}, {n} new each: {ms:.1f} ms")
