"""Prompt reads through the 4-bit kernel against weights dequantized on the fly.

Usage: PYTHONPATH=. python3 tools/wide_read_probe.py [--pair 70b:1b] [--rows 128,256,512]

For each model of the pair: the width :func:`app.engine.wide.measure` finds on
this machine (and how long finding it took), then for each prompt length the
ms to read it into an empty cache as the batch does (one packed forward,
median of three after one that builds kernels) and the peak memory, both ways;
then whether a 512-row prompt read both ways leads to the same 32 greedy tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from app.engine import attention, packed, wide
from app.engine.fuse import fuse
from app.testing import synthetic as syn


def _set(model: nn.Module, mode: wide.Mode) -> int | None:
    wide.set_mode(mode)
    return wide.install(model)


def _read(model: nn.Module, tokens: list[int]) -> list[object]:
    cache = make_prompt_cache(model)
    packed.packed_forward(model, [tokens], [cache])
    mx.eval([c.state for c in cache])
    return cache


def _ms_and_peak(model: nn.Module, tokens: list[int]) -> tuple[float, float]:
    _read(model, tokens)
    laps = []
    mx.reset_peak_memory()
    for _ in range(3):
        t = time.perf_counter()
        _read(model, tokens)
        laps.append(1000 * (time.perf_counter() - t))
    return statistics.median(laps), mx.get_peak_memory() / 2**30


def _greedy(model: nn.Module, tokens: list[int], n: int = 32) -> list[int]:
    cache = make_prompt_cache(model)
    logits = model(mx.array(tokens)[None], cache=cache)
    out: list[int] = [mx.argmax(logits[0, -1]).tolist()]  # type: ignore[list-item]
    for _ in range(n - 1):
        logits = model(mx.array([out[-1:]]), cache=cache)
        out.append(mx.argmax(logits[0, -1]).tolist())  # type: ignore[arg-type]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", default="70b:1b")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rows", default="128,256,512")
    a = ap.parse_args()
    dtype = getattr(mx, a.dtype)
    tname, dname = syn.parse_pair(a.pair)
    vocab = syn.config(tname)["vocab_size"]
    base = syn.prompt(tname, 64)
    head = f"{a.pair} q{a.bits} {a.dtype}: ms to read a prompt (GiB peak)"
    print(f"{head}, 4-bit kernel / dequantized")
    for name, shape in (("target", tname), ("draft", dname)):
        model = syn.build(shape, bits=a.bits, dtype=dtype, vocab_size=vocab)
        fuse(model)
        attention.install(model)
        t = time.perf_counter()
        found = _set(model, "auto")
        took = time.perf_counter() - t
        print(f"{name}: measured width {found} in {took:.2f} s", flush=True)
        cells = []
        for rows in (int(r) for r in a.rows.split(",")):
            _set(model, "off")
            kernel = _ms_and_peak(model, base[:rows])
            _set(model, 1)
            deq = _ms_and_peak(model, base[:rows])
            cells.append(f"{rows}: {kernel[0]:.1f} ({kernel[1]:.1f}) / {deq[0]:.1f} ({deq[1]:.1f})")
        print(f"{name}: " + "  ".join(cells), flush=True)
        _set(model, "off")
        want = _greedy(model, base[:512])
        _set(model, 1)
        got = _greedy(model, base[:512])
        print(f"{name}: 32 greedy tokens after a 512-row read the same both ways: {got == want}")
        del model
        mx.clear_cache()
    wide.set_mode("auto")


if __name__ == "__main__":
    main()
