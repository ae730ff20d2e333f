"""A lone request in the shared batch against the single decoder, where drafting does not pay.

Usage: python3 tools/lone_plain_probe.py [MISS] [PROFILE.json]
       (default 0.5; the tiny synthetic pair in float32, 256 tokens a reply)

Times one request alone, drafting off, on the single decoder and on a
batch, then Auto on a batch, four replies each on fresh caches. Auto starts
from a cost profile measured once (``app.engine.costs.measure_profile``) and
stored at PROFILE.json if given, so that two checkouts compare on the same
costs; its costs carry over from reply to reply, as the app keeps them. Prints
tok/s of each reply and, for Auto, its rounds by k.
"""

from __future__ import annotations

import collections
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

from app.engine.batch import BatchDecoder, take_turns
from app.engine.costs import CostModel, CostProfile, measure_profile
from app.engine.fuse import fuse
from app.engine.speculative import Decoder
from app.engine.types import GenerationParams
from app.testing import synthetic as syn

TOKENS = 256
miss = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
stored = Path(sys.argv[2]) if len(sys.argv) > 2 else None
target = syn.build("tiny", bits=4, dtype=mx.float32)
draft = syn.build("tiny", bits=4, dtype=mx.float32, miss=miss, seed=1)
fuse(target)
fuse(draft)
prompt = syn.prompt("tiny")
if stored is not None and stored.exists():
    profile = CostProfile.from_dict(json.loads(stored.read_text()))
else:
    measured = measure_profile(target, draft, widths=17)
    profile = [e for e in measured if isinstance(e, CostProfile)][-1]
    if stored is not None:
        stored.write_text(json.dumps(profile.as_dict()))
costs = CostModel(17, profile)


def replies(
    name: str, make: Callable[[], Decoder | BatchDecoder], params: GenerationParams
) -> None:
    rates: list[float] = []
    ks: collections.Counter[int] = collections.Counter()
    for i in range(4):
        decoder = make()
        start = time.perf_counter()
        turns = take_turns([decoder.generate([prompt[0]] * (i + 1) + prompt, params)], TOKENS)
        rates.append(round(TOKENS / (time.perf_counter() - start), 1))
        ks.update(r.k for r in turns.rounds[0])
    rounds = f"; rounds by k {dict(sorted(ks.items()))}" if params.num_draft is None else ""
    print(f"{name}: {rates} tok/s{rounds}", flush=True)


off = GenerationParams(num_draft=0, max_tokens=TOKENS)
print(f"miss {miss}: profile's plain step {(profile.verify[0] or 0) * 1e3:.2f} ms", flush=True)
replies("single decoder, drafting off", lambda: Decoder(target), off)
replies("batch, drafting off", lambda: BatchDecoder(target, draft), off)
auto = GenerationParams(num_draft=None, max_tokens=TOKENS)
replies("batch, Auto", lambda: BatchDecoder(target, draft, costs), auto)
