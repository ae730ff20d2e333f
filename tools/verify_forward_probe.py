"""Where a batched verify forward's time goes, and whether drafting can overlap it.

Usage: PYTHONPATH=. python3 tools/verify_forward_probe.py [--pair 70b:1b] [--bits 4]

Builds the synthetic pair, gives each of 8 sequences a cached prompt, then
times (ms, median of five, caches trimmed back after each):

- ``packed``: the engine's packed forward of b sequences x m rows (attention
  per sequence);
- ``no-attn``: the same with each block's attention cut to its q/k/v and o
  projections (so the rest is what attention per sequence costs);
- ``stacked``: the target's rows on a :class:`~app.engine.stacked.Stack` laid
  beforehand, one attention call per layer (what a target cache kept side by
  side would cost per round);
- ``draft``: 15 stacked draft steps of b sequences;
- ``both``: the packed forward and the draft steps in one evaluation, the
  draft on a second GPU stream (whether the two overlap).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from app.engine import packed
from app.engine.fuse import fuse
from app.engine.stacked import Stack, stacked_step
from app.testing import synthetic as syn


def _median_ms(run: Callable[[], Any], after: Callable[[], None], reps: int = 5) -> float:
    mx.eval(run())  # kernels built
    after()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval(run())
        times.append(time.perf_counter() - t)
        after()
    return 1000 * statistics.median(times)


def _projections_only(attn: Any, x: mx.array, lengths: Any, caches: Any) -> mx.array:
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    return attn.o_proj(q + (k.sum() + v.sum()) * 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", default="70b:1b")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--shapes", default="1x16,4x16,8x16,8x8")
    a = ap.parse_args()
    dtype = getattr(mx, a.dtype)
    tname, dname = syn.parse_pair(a.pair)
    target = syn.build(tname, bits=a.bits, dtype=dtype)
    vocab = syn.config(tname)["vocab_size"]
    draft = syn.build(dname, bits=a.bits, dtype=dtype, vocab_size=vocab)
    fuse(target)
    fuse(draft)
    prompt = (syn.prompt(tname, 8) * 8)[: a.prompt]
    tc = [make_prompt_cache(target) for _ in range(8)]
    dc = [make_prompt_cache(draft) for _ in range(8)]
    for model, caches in ((target, tc), (draft, dc)):
        for c in caches:
            mx.eval(packed.packed_forward(model, [prompt], [c]), [x.state for x in c])
    s2 = mx.new_stream(mx.gpu) if mx.default_device() == mx.gpu else mx.default_stream(mx.cpu)
    print(f"{a.pair} q{a.bits} {a.dtype}, {a.prompt}-token caches, ms (median of 5)")
    print("b x m    packed  no-attn  stacked    draft     both")
    for spec in a.shapes.split(","):
        b, m = (int(x) for x in spec.split("x"))
        rows = [list(range(prompt[-1] + 1, prompt[-1] + 1 + m))] * b
        row = _shape_row((target, tc[:b]), (draft, dc[:b]), rows, a.prompt, s2)
        cells = [row.get(k) for k in ("packed", "no-attn", "stacked", "draft", "both")]
        text = "".join(f"{c:9.1f}" if c is not None else "        -" for c in cells)
        print(f"{spec:<6}{text}", flush=True)


def _shape_row(
    target: tuple[Any, list[list[Any]]],
    draft: tuple[Any, list[list[Any]]],
    rows: list[list[int]],
    prompt: int,
    s2: Any,
) -> dict[str, float]:
    """One line of the table: b = len(rows) sequences of m rows each."""
    (tmodel, caches), (dmodel, dcaches) = target, draft
    b, m = len(rows), len(rows[0])

    def trim(cs: list[list[Any]] = caches) -> None:
        for c in cs:
            for layer in c:
                layer.trim(layer.offset - prompt)

    def trim_both() -> None:
        trim()
        trim(dcaches)

    def forward() -> list[mx.array]:
        return packed.packed_forward(tmodel, rows, caches)

    row: dict[str, float] = {"packed": _median_ms(forward, trim)}
    real_attention = packed._attention
    packed._attention = _projections_only
    try:
        row["no-attn"] = _median_ms(forward, trim)
    finally:
        packed._attention = real_attention
    if b == 1:
        return row
    stacks: list[Stack] = []

    def lay() -> None:
        stacks[:] = [Stack(caches, m)]
        mx.eval(stacks[0].keys, stacks[0].values)

    lay()
    tokens = [mx.array(r, dtype=mx.int32) for r in rows]
    row["stacked"] = _median_ms(lambda: stacked_step(tmodel, tokens, stacks[0]), lay)

    def drafting() -> mx.array:
        stack = Stack(dcaches, 16)
        tok = [mx.array([r[0]], dtype=mx.int32) for r in rows]
        for _ in range(15):
            logits = stacked_step(dmodel, tok, stack)
            nxt = mx.argmax(logits[:, -1], axis=-1).astype(mx.int32)
            tok = [nxt[j : j + 1] for j in range(b)]
        return mx.concatenate(tok)

    row["draft"] = _median_ms(drafting, trim_both)

    def both() -> list[mx.array]:
        out = forward()
        with mx.stream(s2):
            d = drafting()
        return [*out, d]

    row["both"] = _median_ms(both, trim_both)
    return row


if __name__ == "__main__":
    main()
