"""What a plain step costs: mlx-lm's loop against Tandem's decoder, interleaved in one process.

Plain steps on the H200 run in spells that last whole replies and hit mlx-lm's loop too, so
each round runs every configuration once, in a rotating order, and the ratios are taken
within a round. Configurations: ``mlx-lm`` (its ``generate_step``), ``tandem`` (a new
decoder each reply, drafting off), ``kept`` (the same, one decoder kept across rounds: each
reply takes the last one's caches over), and with ``--draft``, ``auto`` (the pair on Auto,
kept as the bench keeps it), with a line of what Auto did each round.

    PYTHONPATH=. python3 tools/plain_step_probe.py qwen3.6-27b --bits 4 --dtype bfloat16 \
        --draft qwen3.5-0.8b --miss 0.28 --rounds 8 --tokens 64
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generate_step

from app.engine.decoder import Decoder
from app.engine.options import DEFAULT_OPTIONS
from app.engine.rounds import Prefill, Round
from app.engine.types import DraftSetting, GenerationParams
from app.testing import synthetic as syn


def _per_token(stamps: list[float]) -> float:
    """The mean ms a token after the first (a round's tokens come at once)."""
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1e3


def _mlx_lm(target: Any, prompt: list[int], tokens: int) -> float:
    stamps = []
    for _ in generate_step(mx.array(prompt), target, max_tokens=tokens):
        stamps.append(time.perf_counter())
    return _per_token(stamps)


def _tandem(
    decoder: Decoder, prompt: list[int], tokens: int, k: int | None, seen: list[Round] | None = None
) -> float:
    params = GenerationParams(max_tokens=tokens, drafting=DraftSetting.of(k))
    stamps: list[float] = []
    rounds = decoder.generate(prompt, params)
    for r in rounds:
        if isinstance(r, Prefill):
            continue
        assert isinstance(r, Round)
        stamps += [time.perf_counter()] * len(r.tokens)
        if seen is not None:
            seen.append(r)
        if len(stamps) >= tokens:
            break
    rounds.close()
    return _per_token(stamps)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _what_auto_did(rounds: list[Round], decoder: Decoder) -> str:
    """Auto's reply in a line: its drafting rounds, its plain tokens, the costs it planned with."""
    drafting = [r for r in rounds if r.k]
    plain = sum(len(r.tokens) for r in rounds if not r.k)
    costs = decoder.costs.profile()
    parts = [f"plain tokens {plain}", f"drafting rounds {len(drafting)}"]
    if drafting:
        made = sum(len(r.tokens) for r in drafting)
        ms = sum(r.seconds for r in drafting) / made
        k = sum(r.k for r in drafting) / len(drafting)
        per_round = made / len(drafting)
        parts.append(f"mean k {k:.1f}, {per_round:.2f} tokens a round, {ms * 1e3:.1f} ms a token")
    widths = " ".join(f"v{m} {_ms(costs.v(m))}/{_ms(costs.round_seconds(m))}" for m in (2, 3, 4, 5))
    parts.append(f"planned with: step {_ms(costs.step)} draft {_ms(costs.draft_step)} {widths}")
    return "; ".join(parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shape")
    p.add_argument("--draft")
    p.add_argument("--miss", type=float, default=0.0)
    p.add_argument("--bits", type=int)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args()
    dtype = getattr(mx, args.dtype)
    target = syn.build(args.shape, dtype=dtype, bits=args.bits)
    draft = None
    if args.draft:
        vocab = syn.config(args.shape)["vocab_size"]
        draft = syn.build(
            args.draft, miss=args.miss, vocab_size=vocab, dtype=dtype, seed=1, bits=args.bits
        )
    DEFAULT_OPTIONS.apply()  # mlx-lm's loop runs the paths the decoders run
    prompt = syn.prompt(args.shape)
    auto = Decoder(target, draft) if draft is not None else None

    kept = Decoder(target, None)
    configs: dict[str, Callable[[], float]] = {
        "mlx-lm": lambda: _mlx_lm(target, prompt, args.tokens),
        "tandem": lambda: _tandem(Decoder(target, None), prompt, args.tokens, 0),
        "kept": lambda: _tandem(kept, prompt, args.tokens, 0),
    }
    seen: list[Round] = []
    if auto is not None:
        configs["auto"] = lambda: _tandem(auto, prompt, args.tokens, None, seen)
    names = list(configs)
    for name in names:  # warm-up: kernels built, Auto's costs measured
        configs[name]()
    ms: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        seen.clear()
        for name in order:
            ms[name].append(configs[name]())
        line = "  ".join(f"{n} {ms[n][-1]:6.2f}" for n in names)
        print(f"round {r + 1}: ms a token  {line}", flush=True)
        if auto is not None:
            print(f"  auto: {_what_auto_did(seen, auto)}", flush=True)
    for name in names[1:]:
        ratios = [a / b for a, b in zip(ms[name], ms["mlx-lm"], strict=True)]
        print(
            f"{name} / mlx-lm, within a round: median {statistics.median(ratios):.3f}"
            f" (min {min(ratios):.3f}, max {max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
