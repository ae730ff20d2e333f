"""Seconds of one draft step, several ways, on the machine it runs on.

Usage: python3 tools/draft_step_probe.py [shape]   (default 1b, 4-bit, bfloat16)
"""

from __future__ import annotations

import sys
import time

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from app.engine import attention
from app.engine.speculative import _logits, prefill
from app.testing import synthetic

shape = sys.argv[1] if len(sys.argv) > 1 else "1b"
model = synthetic.build(shape, bits=4, dtype=mx.bfloat16)
cycle = synthetic.prompt(shape, repeats=1)
context = (cycle * (512 // len(cycle) + 1))[:512]


def bare(y: mx.array, cache: list) -> mx.array:
    return mx.argmax(model(y[None], cache=cache)[0, -1:], axis=-1)


def tandem(y: mx.array, cache: list) -> mx.array:
    return mx.argmax(_logits(model, y, cache)[-1:], axis=-1)


def run(step, steps: int) -> float:
    cache = make_prompt_cache(model)
    prefill(model, cache, context[:-1])
    y = mx.array(context[-1:])
    for _ in range(2):
        y = step(y, cache)
        mx.eval(y)
    t0 = time.perf_counter()
    for _ in range(steps):
        y = step(y, cache)
        mx.async_eval(y)
    mx.eval(y)
    return (time.perf_counter() - t0) / steps * 1e3


def mlx_lm(steps: int) -> float:
    gen = generate_step(mx.array(context), model, max_tokens=steps + 2)
    next(gen), next(gen)
    t0 = time.perf_counter()
    for _ in range(steps):
        next(gen)
    return (time.perf_counter() - t0) / steps * 1e3


stream = mx.new_stream(mx.default_device())
for rep in range(2):
    for steps in (16, 64):
        row = {"bare": run(bare, steps), "tandem": run(tandem, steps)}
        with mx.stream(stream):
            row["bare/stream"] = run(bare, steps)
            row["tandem/stream"] = run(tandem, steps)
        row["mlx_lm"] = mlx_lm(steps)
        print(f"rep {rep} steps {steps}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in row.items()))
attention.install(model)
print("after install:", f"{run(tandem, 64):.2f} ms")
