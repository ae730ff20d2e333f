"""What a prompt of a length never seen before costs to read, several ways.

Usage: PYTHONPATH=. python3 tools/prefill_shape_probe.py [--pair 70b:1b] [--bits 4]

Run 22 saw a joining request's prompt take 0.65 s to read through the batch on
a 70B where the same length read again took 0.19 s: MLX's CUDA backend builds
kernels and graphs per shape. For several fresh lengths this times reading a
whole prompt into an empty cache (ms, first time and again at that length):

- ``model``: mlx-lm's forward, as the lone decoder reads a prompt;
- ``packed``: the engine's packed forward, as the batch reads one;
- ``padded``: the packed forward with the rows padded to a multiple of 64 and
  the cache cut back after (the padding comes last, so no real row sees it);
- ``bucketed``: attention over the key length rounded up to 256, masked;
- ``padded+bucketed``: both.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from app.engine import attention, packed
from app.engine.fuse import fuse
from app.testing import synthetic as syn

PAD = attention.ROWS


def _read(model: nn.Module, tokens: list[int], how: str) -> None:
    cache = make_prompt_cache(model)
    n = len(tokens)
    rows = tokens + [tokens[-1]] * (-n % PAD) if "padded" in how else tokens
    if how == "model":
        model(mx.array(rows)[None], cache=cache)
    else:
        packed.packed_forward(model, [rows], [cache])
    if len(rows) > n:
        trim_prompt_cache(cache, len(rows) - n)
    mx.eval([c.state for c in cache])


def _ms(run: Callable[[], None]) -> float:
    t = time.perf_counter()
    run()
    return 1000 * (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", default="70b:1b")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--lengths", default="131,141,157,173,190")
    a = ap.parse_args()
    dtype = getattr(mx, a.dtype)
    tname, dname = syn.parse_pair(a.pair)
    vocab = syn.config(tname)["vocab_size"]
    models = {
        "target": syn.build(tname, bits=a.bits, dtype=dtype),
        "draft": syn.build(dname, bits=a.bits, dtype=dtype, vocab_size=vocab),
    }
    for m in models.values():
        fuse(m)
        attention.install(m)
    base = syn.prompt(tname, 64)
    lengths = [int(x) for x in a.lengths.split(",")]
    hows = ["model", "packed", "padded", "bucketed", "padded+bucketed"]
    print(f"{a.pair} q{a.bits} {a.dtype}; ms to read a prompt: first at its length / again")
    for name, model in models.items():
        _read(model, base[:100], "model")  # the model's weights and first kernels
        for offset, how in enumerate(hows):
            attention.set_mode("bucketed" if "bucketed" in how else "sdpa")
            attention.MAX_QUERIES = 1 << 20 if "bucketed" in how else 32
            cells = []
            for n in lengths:
                tokens = base[: n + offset]  # each way meets lengths of its own
                read = functools.partial(_read, model, tokens, how)
                first, again = _ms(read), _ms(read)
                cells.append(f"{n + offset}: {first:7.1f} / {again:6.1f}")
            print(f"{name:6} {how:16} " + "  ".join(cells), flush=True)
    attention.MAX_QUERIES = 32
    attention.set_mode("auto")


if __name__ == "__main__":
    main()
