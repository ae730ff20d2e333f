"""What requests that share the start of their prompts wait for their first token.

Usage: python3 tools/shared_prompt_probe.py [SHAPE] [DTYPE] [SYSTEM] [REQUESTS]
       (default 0.5b float32 256 8: this CPU; 4-bit unless the shape ends in ":full")

A team's requests share a system prompt of SYSTEM tokens, each followed by a
question of its own (16 tokens). Times, on one batch with and without
``share_prompts`` (drafting off, so only the reads differ):

- ``together``: REQUESTS open at once; seconds until every one has its first
  token, then until each has 16;
- ``joining``: one request decodes, then REQUESTS - 1 more open; seconds
  until they have their first token.

Each case runs twice, the first building kernels; the second is printed,
with the prompt rows the target read.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Generator
from typing import Any

import mlx.core as mx

from app.engine.decoder import Decoder
from app.engine.fuse import fuse
from app.engine.observe import EngineEvent, PrefillChunk
from app.engine.options import EngineOptions
from app.engine.rounds import Round
from app.engine.types import DraftSetting, GenerationParams
from app.testing import synthetic as syn

spec = sys.argv[1] if len(sys.argv) > 1 else "0.5b"
dtype = getattr(mx, sys.argv[2] if len(sys.argv) > 2 else "float32")
system_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 256
count = int(sys.argv[4]) if len(sys.argv) > 4 else 8
shape, _, full = spec.partition(":")
target = syn.build(shape, bits=None if full else 4, dtype=dtype)
fuse(target)
cycle = syn.prompt(shape)
system = (cycle * (system_tokens // len(cycle) + 1))[:system_tokens]
params = GenerationParams(drafting=DraftSetting.fixed(0), max_tokens=64)
rows = [0]


def counted(event: EngineEvent) -> None:
    """Prompt rows the target read, from the batch's observer hook."""
    if isinstance(event, PrefillChunk):
        rows[0] += event.rows


def question(j: int) -> list[int]:
    return [cycle[(7 * j + i) % len(cycle)] for i in range(16)]


def first_tokens(gens: list[Generator[Any, None, None]]) -> list[list[int]]:
    """Pulls each until its first round; the tokens so far."""
    out: list[list[int]] = [[] for _ in gens]
    for g, tokens in zip(gens, out, strict=True):
        while not tokens:
            event = next(g)
            if isinstance(event, Round):
                tokens += event.tokens
    return out


def together(share: bool, salt: int) -> str:
    batch = Decoder(target, options=EngineOptions(share_prompts=share))
    batch.subscribe(counted)
    rows[0] = 0
    start = time.perf_counter()
    gens = [batch.generate([salt, *system, *question(j)], params) for j in range(count)]
    first_tokens(gens)
    first = time.perf_counter() - start
    for _ in range(15):
        for g in gens:
            next(g)
    whole = time.perf_counter() - start
    for g in gens:
        g.close()
    return f"first tokens {first:.2f} s, 16 each {whole:.2f} s, rows read {rows[0]}"


def joining(share: bool, salt: int) -> str:
    batch = Decoder(target, options=EngineOptions(share_prompts=share))
    batch.subscribe(counted)
    running = batch.generate([salt, *system, *question(99)], params)
    first_tokens([running])
    rows[0] = 0
    start = time.perf_counter()
    gens = [batch.generate([salt, *system, *question(j)], params) for j in range(count - 1)]
    first_tokens(gens)
    first = time.perf_counter() - start
    for g in [running, *gens]:
        g.close()
    return f"first tokens {first:.2f} s, rows read {rows[0]}"


print(f"{spec} {dtype}, {count} requests, {system_tokens}-token system prompt + 16 each")
for case in (together, joining):
    for share in (True, False):
        case(share, 1)  # builds
        print(f"{case.__name__}, share {'on' if share else 'off'}: {case(share, 2)}", flush=True)
