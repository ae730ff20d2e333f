"""Python time to build one packed target forward (the graph, not its run), by sequences.

Usage: PYTHONPATH=. python3 tools/packed_build_probe.py

An 80-layer llama as deep as the 70B shape but 64 wide, so that the run costs
little and what is timed is the Python that lays out the graph: the
projections once over every row, then per sequence and layer RoPE on the
queries and keys, the cache update and attention (app/engine/packed.py).
"""

from __future__ import annotations

import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from app.engine.packed import packed_forward
from app.testing import synthetic as syn

syn.SHAPES["deep"] = syn.Shape("llama", 80, 64, 4, 2, 128, 384)
model = syn.build("deep", bits=4)


def caches(b: int) -> list[list]:
    cs = [make_prompt_cache(model) for _ in range(b)]
    out = packed_forward(model, [list(range(8, 308)) for _ in range(b)], cs)
    mx.eval(out, [c.state for cc in cs for c in cc])
    return cs


for b, m in [(1, 16), (4, 16), (8, 16), (8, 8), (8, 1)]:
    cs = caches(b)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        out = packed_forward(model, [list(range(20, 20 + m)) for _ in range(b)], cs)
        times.append(time.perf_counter() - t)
        mx.eval(out, [c.state for cc in cs for c in cc])
        for cc in cs:
            for c in cc:
                c.trim(m)
    print(f"{b} sequences x {m} rows: {1000 * statistics.median(times):.1f} ms to build")
