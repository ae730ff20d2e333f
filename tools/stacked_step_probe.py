"""What a stacked draft step of several sequences costs, and what in it, on this machine.

Usage: python3 tools/stacked_step_probe.py [draft shape] [dtype]
       (default 1b, bfloat16; 4-bit unless the shape ends in ":full")

Times the batch's draft step (``app.engine.stacked.stacked_step``: the
sequences' caches side by side, one attention call a layer with a boolean
mask) for 2, 4 and 8 sequences of about 300 cached tokens, pipelined as the
batch drafts (each step's argmax fed to the next, evaluated asynchronously),
against one sequence's plain step. Variants of the stacked step: its mask
made additive in the model's dtype beforehand, and no mask at all (wrong
attention, for its time only). Prints ms per step, the median of three runs
of 32 steps after a run that builds.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from app.engine.fuse import fuse
from app.engine.packed import packed_forward
from app.engine.stacked import Stack, stacked_step
from app.testing import synthetic

spec = sys.argv[1] if len(sys.argv) > 1 else "1b"
dtype = getattr(mx, sys.argv[2] if len(sys.argv) > 2 else "bfloat16")
shape, _, full = spec.partition(":")
model = synthetic.build(shape, bits=None if full else 4, dtype=dtype)
fuse(model)
cycle = synthetic.prompt(shape, repeats=1)
STEPS = 32


def caches(count: int) -> list[list[Any]]:
    out = [make_prompt_cache(model) for _ in range(count)]
    prompts = [(cycle * 40)[: 290 + 7 * j] for j in range(count)]
    packed_forward(model, [mx.array(p) for p in prompts], out)
    mx.eval([c.state for cache in out for c in cache])
    return out


def timed(run: Callable[[], float]) -> float:
    run()  # builds
    return statistics.median(run() for _ in range(3)) / STEPS * 1e3


def lone() -> float:
    cache = caches(1)[0]
    y = mx.array([cycle[0]])
    start = time.perf_counter()
    for _ in range(STEPS):
        y = mx.argmax(model(y[None], cache=cache)[0, -1:], axis=-1)
        mx.async_eval(y)
    mx.eval(y)
    return time.perf_counter() - start


def stacked(count: int, mask: str) -> Callable[[], float]:
    real_begin = Stack.begin
    laid = caches(count)

    def begin(self: Stack, rows: Any) -> tuple[int, mx.array, Any]:
        col, offsets, m = real_begin(self, rows)
        if mask == "additive":
            m = mx.where(m, mx.array(0, dtype), mx.array(-mx.inf, dtype))
        return col, offsets, None if mask == "none" else m

    def run() -> float:
        stack = Stack(laid, STEPS)
        mx.eval(stack.keys, stack.values)
        ys = [mx.array([cycle[0]]) for _ in range(count)]
        Stack.begin = begin  # type: ignore[method-assign]
        try:
            start = time.perf_counter()
            for _ in range(STEPS):
                logits = stacked_step(model, ys, stack)
                ys = [mx.argmax(logits[j, -1:], axis=-1) for j in range(count)]
                mx.async_eval(ys)
            mx.eval(ys)
            return time.perf_counter() - start
        finally:
            Stack.begin = real_begin  # type: ignore[method-assign]

    return run


weights = "unquantized" if full else "4-bit"
print(f"{spec} ({weights}, {dtype}): ms per draft step")
print(f"one sequence, plain step: {timed(lone):.2f}")
for count in (2, 4, 8):
    row = {mask: timed(stacked(count, mask)) for mask in ("boolean", "additive", "none")}
    cells = ", ".join(f"{k} mask {v:.2f}" for k, v in row.items())
    print(f"{count} sequences stacked: {cells}", flush=True)
