"""A lone request's rounds at miss 0 and at 0.1, each split into its parts, on this machine.

Usage: python3 tools/miss_round_probe.py [pair] [k] [tokens]
       (default 8b:1b, 15, 256; 4-bit, bfloat16; the app's MLX settings)

Greedy, k fixed. The draft is evaluated before the verification starts, so
every round splits into the draft's seconds, the verification's (its verdict
syncs) and the rest (planning, rewinding, bookkeeping). Each miss rate is
warmed up over the same number of tokens first, on a prompt one token
shorter, so no measured round meets a cache length seen before. Run it again
with ``MLX_USE_CUDA_GRAPHS=0`` to see what CUDA graphs do to either rate.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import mlx.core as mx

from app.engine.fuse import fuse
from app.engine.speculative import Decoder, Round
from app.engine.types import GenerationParams
from app.testing import synthetic

pair = sys.argv[1] if len(sys.argv) > 1 else "8b:1b"
k = int(sys.argv[2]) if len(sys.argv) > 2 else 15
tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 256
t_shape, d_shape = synthetic.parse_pair(pair)
target = synthetic.build(t_shape, bits=4, dtype=mx.bfloat16)
fuse(target)
vocab = target.args.vocab_size
cycle = synthetic.prompt(t_shape)
parts: dict[str, float] = {}
real_propose, real_verify = Decoder._propose, Decoder._verify


def _propose(self: Decoder, *args: Any, **kwargs: Any) -> Any:
    start = time.perf_counter()
    proposal = real_propose(self, *args, **kwargs)
    mx.eval(proposal.tokens)
    parts["draft"] = time.perf_counter() - start
    return proposal


def _verify(self: Decoder, *args: Any, **kwargs: Any) -> Any:
    start = time.perf_counter()
    verdict = real_verify(self, *args, **kwargs)
    parts["verify"] = time.perf_counter() - start
    return verdict


Decoder._propose = _propose  # type: ignore[method-assign]
Decoder._verify = _verify  # type: ignore[method-assign]


def reply(draft: Any, prompt: list[int]) -> list[dict[str, float]]:
    decoder = Decoder(target, draft)
    rows: list[dict[str, float]] = []
    got = 0
    for event in decoder.generate(prompt, GenerationParams(num_draft=k)):
        if isinstance(event, Round):
            got += len(event.tokens)
            if event.k == k:
                rest = event.seconds - parts["draft"] - parts["verify"]
                rows.append({**parts, "round": event.seconds, "rest": rest, "n": event.accepted})
            if got >= tokens:
                break
    return rows


def ms(rows: list[dict[str, float]], key: str) -> str:
    return f"{1e3 * statistics.median(r[key] for r in rows):6.1f}"


print(f"{pair}, k = {k}, {tokens} tokens a reply; medians of rounds of k = {k}, ms")
print("miss  rounds accepted   round   draft  verify    rest")
for miss in (0.0, 0.1, 0.0, 0.1):
    draft = synthetic.build(d_shape, miss=miss, vocab_size=vocab, dtype=mx.bfloat16, seed=1, bits=4)
    fuse(draft)
    reply(draft, cycle[1:])  # the warm-up
    rows = reply(draft, cycle)
    accepted = statistics.mean(r["n"] for r in rows)
    cols = " ".join(ms(rows, key) for key in ("round", "draft", "verify", "rest"))
    print(f"{miss:4.1f} {len(rows):7d} {accepted:8.1f} {cols}", flush=True)
