"""What a plain step is measured at, against what plain decoding really takes a token.

Usage: python3 tools/plain_pace_probe.py [SHAPE] [DTYPE] [TOKENS]
       (default 8b bfloat16 256; on this CPU: tiny float32)

Decodes plainly (drafting off) with the single decoder and with a lone
request on the batch, three replies each, and prints per reply, in ms:

- ``wall``: a token's share of the reply's wall clock from its first token
  to its last, what plain decoding costs a token;
- ``gap``: the median gap from asking for a token to getting it, the rule
  both plain loops timed their steps by before (on a backend that runs
  queued steps together the gaps alternate long and short);
- ``measured``: the median of the steps the loop handed to its cost model
  (``CostModel.observe_step``), the rule of this checkout.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Generator
from typing import Any

import mlx.core as mx

from app.engine.batch import BatchDecoder
from app.engine.costs import CostModel, CostProfile
from app.engine.fuse import fuse
from app.engine.speculative import Decoder, Round
from app.engine.types import GenerationParams
from app.testing import synthetic as syn

shape = sys.argv[1] if len(sys.argv) > 1 else "8b"
dtype = getattr(mx, sys.argv[2] if len(sys.argv) > 2 else "bfloat16")
tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 256
target = syn.build(shape, bits=4, dtype=dtype)
fuse(target)
prompt = syn.prompt(shape)
seen: list[float] = []
real_observe = CostModel.observe_step


def observe(self: CostModel, seconds: float) -> None:
    seen.append(seconds)
    real_observe(self, seconds)


CostModel.observe_step = observe  # type: ignore[method-assign]


def known_costs() -> CostModel:
    """Every width priced, so the batch's plain bursts time their steps (it waits for that)."""
    return CostModel(17, CostProfile(tuple([0.01] * 17), 0.001, 64, "probe", "0"))


def reply(gen: Generator[Any, None, None]) -> tuple[float, float, float]:
    seen.clear()
    got: list[float] = []
    gaps: list[float] = []
    while len(got) < tokens:
        asked = time.perf_counter()
        event = next(gen)
        if isinstance(event, Round):
            now = time.perf_counter()
            got.append(now)
            gaps.append(now - asked)
    gen.close()
    wall = (got[-1] - got[0]) / (len(got) - 1)
    return wall, statistics.median(gaps[1:]), statistics.median(seen) if seen else float("nan")


def run(name: str, make: Callable[[], Decoder | BatchDecoder]) -> None:
    params = GenerationParams(num_draft=0, max_tokens=tokens + 8)
    for i in range(4):
        wall, gap, measured = reply(make().generate([prompt[0]] * (i + 1) + prompt, params))
        if i:  # the first builds kernels
            cells = f"wall {wall * 1e3:.2f}, gap {gap * 1e3:.2f}, measured {measured * 1e3:.2f}"
            print(f"{name}: {cells}", flush=True)


print(f"{shape} q4 {sys.argv[2] if len(sys.argv) > 2 else 'bfloat16'}, {tokens} tokens, ms a token")
run("single decoder", lambda: Decoder(target, None, known_costs()))
run("batch, lone request", lambda: BatchDecoder(target, None, known_costs()))
