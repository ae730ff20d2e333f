"""Synthetic model pairs of real shapes with a set greedy acceptance.

Every layer's output projections are zero, so each hidden state is its token's
embedding; embeddings and the LM head are wired so that next(t) = t + 1 on a
short cycle. The draft predicts t + 2 instead for a chosen fraction of tokens,
so its greedy acceptance is known in advance. The other weights are random,
so every forward costs what the real shape costs, and no weights need to be
downloaded.
"""

from __future__ import annotations

import random
from typing import Any

import mlx.core as mx
import mlx.nn as nn

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=384,
    ),
    "0.5b": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
    ),
    "1.5b": dict(
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        vocab_size=151936,
    ),
    "7b": dict(
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        vocab_size=152064,
    ),
}
CYCLE_START = 10


def config(shape: str, vocab_size: int | None = None) -> dict[str, Any]:
    """A qwen2 ``config.json`` of a named shape."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape '{shape}' (one of {', '.join(SHAPES)})")
    cfg = {
        "model_type": "qwen2",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        **SHAPES[shape],
    }
    if vocab_size is not None:
        cfg["vocab_size"] = vocab_size
    return cfg


def cycle_length(shape: str) -> int:
    return min(64, SHAPES[shape]["hidden_size"])


def build(
    shape: str,
    *,
    miss: float = 0.0,
    vocab_size: int | None = None,
    dtype: mx.Dtype = mx.float32,
    seed: int = 0,
) -> nn.Module:
    """A model whose greedy continuation of cycle token t is t + 1.

    Args:
        shape: One of :data:`SHAPES`.
        miss: Fraction of cycle tokens for which it predicts t + 2 instead
            (a draft that the target rejects there).
        vocab_size: Overrides the shape's vocabulary (a draft must match its target).
        dtype: Weight dtype.
        seed: Seed of the random weights.
    """
    from mlx_lm.models import qwen2

    cfg = config(shape, vocab_size)
    mx.random.seed(seed)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(cfg))
    model.set_dtype(dtype)
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    length = cycle_length(shape)
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight = mx.zeros_like(layer.self_attn.o_proj.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
    tokens = mx.arange(CYCLE_START, CYCLE_START + length)
    embed = mx.zeros((vocab, hidden), dtype=dtype)
    embed[tokens, mx.arange(length)] = 1.0
    model.model.embed_tokens.weight = embed
    # Scatter the misses: an even spacing would alias with the rhythm of rounds.
    missed = set(random.Random(seed).sample(range(length), round(miss * length)))
    head = mx.zeros((vocab, hidden), dtype=dtype)
    for i in range(length):
        step = 2 if i in missed else 1
        head[CYCLE_START + (i + step) % length, i] = 1.0
    model.lm_head.weight = head
    mx.eval(model.parameters())
    return model


def prompt(shape: str, repeats: int = 2) -> list[int]:
    """A prompt of the cycle, which the models continue."""
    length = cycle_length(shape)
    return [CYCLE_START + i for i in range(length)] * repeats


def parse_pair(spec: str) -> tuple[str, str]:
    """``"7b:0.5b"`` -> ``("7b", "0.5b")``."""
    target, _, draft = spec.partition(":")
    for s in (target, draft):
        if s not in SHAPES:
            raise ValueError(f"unknown shape '{s}' in '{spec}' (one of {', '.join(SHAPES)})")
    return target, draft
