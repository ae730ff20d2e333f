"""Whether the target's caches kept side by side from round to round would pay.

Usage: PYTHONPATH=. python3 tools/side_by_side_probe.py [--pair 70b:1b] [--streams 8] [--rows 16]

Run 18 measured a batched verify forward of 8 x 16 rows at 236 ms with each
sequence attending over its own cache, and 201 ms with one attention call per
layer over caches laid side by side beforehand (tools/verify_forward_probe.py).
Laying them out costs a copy of every cache; keeping them laid out means the
batch's rounds leave holes where drafts are rejected. This times rounds both
ways, accepted lengths drawn at random, ms per round (median of the rounds):

- ``apart``: one packed forward (attention per sequence), then each sequence's
  cache trimmed to what it accepted (``BatchDecoder(side_by_side=False)``);
- ``side by side``: one forward over caches kept side by side
  (:class:`app.engine.side_by_side.SideBySide`, as ``BatchDecoder`` runs by
  default), rejected columns masked out instead of trimmed, compacted when the
  columns run out; the compactions' time is spread over the rounds.

It also checks that the two give the same greedy tokens round by round.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from app.engine.fuse import fuse
from app.engine.packed import packed_forward
from app.engine.side_by_side import SideBySide
from app.engine.stacked import stacked_step
from app.testing import synthetic as syn


def _prefilled(model: Any, prompts: list[list[int]]) -> list[list[Any]]:
    caches = [make_prompt_cache(model) for _ in prompts]
    for c, p in zip(caches, prompts, strict=True):
        mx.eval(packed_forward(model, [p], [c]), [x.state for x in c])
    return caches


def _rounds(
    target: Any, prompts: list[list[int]], accepted: list[list[int]], n_rows: int, room: int
) -> tuple[dict[str, list[float]], SideBySide, bool]:
    """Times each round both ways; also whether they picked the same greedy tokens."""
    apart = _prefilled(target, prompts)
    side = SideBySide(_prefilled(target, prompts), room)
    mx.eval(side.keys, side.values)
    feeds = [mx.array([p[-1]], dtype=mx.int32) for p in prompts]
    times: dict[str, list[float]] = {"apart": [], "side by side": []}
    same = True
    for n, kept_drafts in enumerate(accepted):
        # The rows a round verifies: each sequence's last token, then its "draft" (the
        # target's own greedy continuation is not known yet, so any tokens do).
        rows = [mx.concatenate([f, mx.arange(1, n_rows, dtype=mx.int32) + n]) for f in feeds]
        t = time.perf_counter()
        logits = packed_forward(target, rows, apart)
        picks = mx.concatenate([lg[0].argmax(-1) for lg in logits])
        mx.eval(picks)
        for c, k in zip(apart, kept_drafts, strict=True):
            trim_prompt_cache(c, n_rows - (k + 1))
        times["apart"].append(time.perf_counter() - t)

        t = time.perf_counter()
        out = stacked_step(target, rows, side)
        side_picks = out.argmax(-1).reshape(-1)
        mx.eval(side_picks)
        side.settle([k + 1 for k in kept_drafts])
        times["side by side"].append(time.perf_counter() - t)
        same &= bool(mx.all(picks == side_picks).item())
        feeds = [
            mx.array([picks[j * n_rows + k].item()], dtype=mx.int32)
            for j, k in enumerate(kept_drafts)
        ]

    return times, side, same


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", default="70b:1b")
    ap.add_argument("--bits", type=int, default=4, help="4 or 8; 0 keeps --dtype")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--room", type=int, default=256, help="columns laid out beyond the longest")
    ap.add_argument(
        "--replay",
        action="store_true",
        help="then the same rounds again from fresh caches (MLX's CUDA graphs are cached by shape)",
    )
    a = ap.parse_args()
    tname, _ = syn.parse_pair(a.pair)
    target = syn.build(tname, bits=a.bits or None, dtype=getattr(mx, a.dtype))
    fuse(target)
    base = (syn.prompt(tname, 8) * 8)[: a.prompt]
    # Different last tokens, so each sequence goes its own way.
    prompts = [[*base[:-1], base[-1 - i]] for i in range(a.streams)]
    rnd = random.Random(0)
    accepted = [[rnd.randint(0, a.rows - 1) for _ in range(a.streams)] for _ in range(a.rounds)]

    times, side, same = _rounds(target, prompts, accepted, a.rows, a.room)
    if a.replay:  # the same rounds again, from fresh caches: every shape seen before
        again, _, same_again = _rounds(target, prompts, accepted, a.rows, a.room)
        times.update({f"{name}, again": ts for name, ts in again.items()})
        same &= same_again
    skip = max(2, a.rounds // 10)  # the first rounds build kernels
    weights = f"q{a.bits} {a.dtype}" if a.bits else a.dtype
    print(
        f"{a.pair} {weights}, {a.streams} sequences x {a.rows} rows, "
        f"{a.prompt}-token prompts, {a.rounds} rounds, {side.compactions} compactions, "
        f"{side.size} columns at the end"
    )
    for name, ts in times.items():
        kept = ts[skip:]
        print(f"{name:>20}: {1000 * statistics.median(kept):.1f} ms a round (median), "
              f"{1000 * statistics.mean(kept):.1f} mean")  # fmt: skip
    print(f"same greedy tokens every round: {'yes' if same else 'no'}")


if __name__ == "__main__":
    main()
