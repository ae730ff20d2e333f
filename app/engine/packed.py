"""One target forward for several sequences, their rows packed into one matrix.

Batched verification pays only if the projections and the MLP see all the
batch's rows at once: MLX's CUDA backend runs a 4-bit matmul once per batch
element, so a 70B's projections for 16 rows cost 34 ms as one (1, 16) matrix
and 120 ms as (4, 4). Attention and the caches are per sequence, so only they
are split: each sequence's rows attend over its own cache, at its own offset.

Only pre-norm decoder blocks of the Llama kind (Llama, Qwen2, Mistral: norm,
attention, residual, norm, MLP, residual) are packed; :func:`packable` says
whether a model is one.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn

PACKABLE = frozenset({"llama", "qwen2", "mistral"})


def packable(model: nn.Module) -> bool:
    """Whether ``model``'s blocks can be run packed by :func:`packed_forward`."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if getattr(model, "model_type", None) not in PACKABLE or not layers:
        return False
    block = layers[0]
    attention = getattr(block, "self_attn", None)
    names = ("input_layernorm", "post_attention_layernorm", "mlp")
    return all(hasattr(block, n) for n in names) and all(
        hasattr(attention, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "rope")
    )


def packed_forward(
    model: nn.Module, tokens: Sequence[Sequence[int] | mx.array], caches: Sequence[list[Any]]
) -> list[mx.array]:
    """Runs each sequence's new ``tokens`` into its own cache in one forward.

    Args:
        model: A model :func:`packable` accepts.
        tokens: New tokens of each sequence (at least one each), as ints or as
            a lazy ``(n,)`` array (a draft's tokens, not yet evaluated).
        caches: Each sequence's per-layer KV cache, as ``make_prompt_cache`` makes.

    Returns:
        Each sequence's logits, ``(1, len(tokens[i]), vocab)``: what ``model``
        returns for that sequence alone.

    Raises:
        ValueError: The model is not packable, or the inputs do not pair up.
    """
    if not packable(model):
        raise ValueError(f"{getattr(model, 'model_type', type(model).__name__)} cannot be packed")
    rows = [
        t.astype(mx.int32) if isinstance(t, mx.array) else mx.array(list(t), dtype=mx.int32)
        for t in tokens
    ]
    lengths = [r.size for r in rows]
    if len(rows) != len(caches) or not rows or not all(lengths):
        raise ValueError("give each sequence at least one token and its cache")
    inner = model.model
    h = inner.embed_tokens(mx.concatenate(rows)[None])
    for i, layer in enumerate(inner.layers):
        layer_caches = [c[i] for c in caches]
        h = h + _attention(layer.self_attn, layer.input_layernorm(h), lengths, layer_caches)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    logits = head(model, inner.norm(h))
    return list(mx.split(logits, _bounds(lengths), axis=1))


def _bounds(lengths: Sequence[int]) -> list[int]:
    """Where each sequence after the first starts among the packed rows."""
    return list(itertools.accumulate(lengths[:-1]))


def _attention(attn: Any, x: mx.array, lengths: Sequence[int], caches: Sequence[Any]) -> mx.array:
    """The block's attention: projections over every row, attention per sequence."""
    queries, keys, values = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    sdpa = sys.modules[type(attn).__module__].scaled_dot_product_attention
    bounds = _bounds(lengths)
    parts = zip(
        mx.split(queries, bounds, axis=1),
        mx.split(keys, bounds, axis=1),
        mx.split(values, bounds, axis=1),
        lengths,
        caches,
        strict=True,
    )
    out = []
    for q, k, v, n, cache in parts:
        q = q.reshape(1, n, attn.n_heads, -1).transpose(0, 2, 1, 3)
        k = k.reshape(1, n, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = v.reshape(1, n, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q = attn.rope(q, offset=cache.offset)
        k = attn.rope(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        # mlx-lm's own masks: causal for several new rows, none for one.
        mask = "causal" if n > 1 else None
        o = sdpa(q, k, v, cache=cache, scale=attn.scale, mask=mask)
        out.append(o.transpose(0, 2, 1, 3).reshape(1, n, -1))
    y: mx.array = attn.o_proj(mx.concatenate(out, axis=1))
    return y


def head(model: Any, h: mx.array) -> mx.array:
    """The model's output projection: its own head, or the tied embedding."""
    lm_head = getattr(model, "lm_head", None)
    logits: mx.array = lm_head(h) if lm_head is not None else model.model.embed_tokens.as_linear(h)
    return logits


__all__ = ["PACKABLE", "head", "packable", "packed_forward"]
