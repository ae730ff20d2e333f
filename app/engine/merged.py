"""One forward for several sequences of a model that packing does not cover: the hybrids.

:mod:`app.engine.packed` runs Llama-kind blocks itself. A hybrid model (Gated
DeltaNet, Mamba or short-convolution layers among attention) runs as mlx-lm
built it, over a batch: each layer's caches of the sequences merged into one
(attention's keys left-padded into a ``BatchKVCache``, with room for the new
rows; the recurrent states stacked), every sequence's rows right-padded to the
longest's, and after the forward each sequence's part split back into its own
caches, its padding rows given back. One forward a step instead of one per
sequence: each weight is read once, each kernel launched once.

A sequence's padding rows come after its own, so causal attention keeps them
out of its logits; the recurrent states they write are given back as a
rejected draft's are (:class:`app.engine.recurrent.RecurrentCache`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import BatchKVCache, CacheList, KVCache

from app.engine.mtp import HiddenRows, MTPDraft
from app.engine.packed import packable, packed_forward
from app.engine.recurrent import DEPTH, REWOUND, RecurrentCache, leaves
from app.engine.stacked import SLACK


def mergeable(model: nn.Module, caches: Sequence[list[Any]]) -> bool:
    """Whether several sequences' ``caches`` of ``model`` can run in one merged forward.

    The model must be a hybrid whose states go back (:data:`~app.engine.recurrent.REWOUND`,
    each tested in tests/engine/test_hybrids.py against plain decoding); each layer's caches
    plain KV caches, recurrent caches or lists of them (or the states an MTP
    head reads), all of one kind, none empty; and their keys, padded to the
    longest's, within :data:`SLACK` times their own size (as the memory a
    batched reply budgets allows).
    """
    if len(caches) < 2 or type(model).__module__.rsplit(".", 1)[-1] not in REWOUND:
        return False
    if not all(_mergeable(list(layer)) for layer in zip(*caches, strict=True)):
        return False
    lengths = [next((c.offset for c in leaves(cache) if type(c) is KVCache), 0) for cache in caches]
    return len(lengths) * max(lengths) <= SLACK * sum(lengths)


def _mergeable(layer: list[Any]) -> bool:
    kind = type(layer[0])
    if any(type(c) is not kind for c in layer):
        return False
    if kind is CacheList:
        return all(_mergeable([c.caches[i] for c in layer]) for i in range(len(layer[0].caches)))
    if kind is KVCache:
        return all(c.offset > 0 for c in layer)
    if kind is HiddenRows:
        return True
    if kind is not RecurrentCache or any(s is None for c in layer for s in c.cache):
        return False
    # States of one shape (LongCat's last tokens are fewer while a prompt is shorter).
    slots = zip(*(c.cache for c in layer), strict=True)
    return all(len({s.shape for s in slot}) == 1 for slot in slots)


def joint_forward(
    model: nn.Module, tokens: Sequence[mx.array], caches: Sequence[list[Any]]
) -> list[mx.array] | None:
    """Several sequences' new ``tokens`` in one forward: packed where the model is of the
    Llama kind, merged where :func:`mergeable`, MTP heads' steps side by side; None where
    none of these (run them one by one)."""
    if len(tokens) > 1 and packable(model):
        return packed_forward(model, tokens, caches)
    if isinstance(model, MTPDraft):
        if len(tokens) > 1 and all(c[0].offset > 0 for c in caches):
            return _heads_forward(model, tokens, caches)
        return None
    lengths = [t.size for t in tokens]
    # Padding rows are given back as a round's are: within the rows a forward can go back.
    if (max(lengths) <= DEPTH or min(lengths) == max(lengths)) and mergeable(model, caches):
        return merged_forward(model, tokens, caches)
    return None


def merged_forward(
    model: nn.Module, tokens: Sequence[mx.array], caches: Sequence[list[Any]]
) -> list[mx.array]:
    """Runs each sequence's new ``tokens`` into its own caches in one batched forward.

    Args:
        model: A model whose ``caches`` :func:`mergeable` accepts.
        tokens: Each sequence's new tokens, a ``(n,)`` array (lazy is fine), n ≥ 1.
        caches: Each sequence's per-layer caches.

    Returns:
        Each sequence's logits, ``(1, n, vocab)``.
    """
    lengths = [t.size for t in tokens]
    rows = max(lengths)
    x = mx.stack([_pad(t.astype(mx.int32), rows) for t in tokens])
    merged = [_merge(list(layer), rows) for layer in zip(*caches, strict=True)]
    logits = model(x, cache=merged)
    for i, batch in enumerate(merged):
        _split(batch, [c[i] for c in caches], rows)
    for cache, n in zip(caches, lengths, strict=True):
        if n < rows:
            for c in cache:
                c.trim(rows - n)
    return [logits[j : j + 1, :n] for j, n in enumerate(lengths)]


def _heads_forward(
    model: MTPDraft, tokens: Sequence[mx.array], caches: Sequence[list[Any]]
) -> list[mx.array]:
    """Several requests' MTP head steps in one forward, their head caches merged as a
    target's attention caches are, each request's states beside its tokens."""
    lengths = [t.size for t in tokens]
    rows = max(lengths)
    own = [c[0] for c in caches]
    parts = [model.inputs(t[None].astype(mx.int32), c) for t, c in zip(tokens, own, strict=True)]
    embedded = mx.concatenate([_pad_rows(e, rows) for e, _ in parts])
    hidden = mx.concatenate([_pad_rows(h, rows) for _, h in parts])
    kv = [_merge([c.kv[i] for c in own], rows) for i in range(len(own[0].kv))]
    states = model.head(embedded, hidden, kv)
    for i, batch in enumerate(kv):
        _split(batch, [c.kv[i] for c in own], rows)
    out = []
    for j, (c, n) in enumerate(zip(own, lengths, strict=True)):
        c.trim(rows - n)  # its padding rows
        out.append(model.outputs(states[j : j + 1, :n], c))
    return out


def _pad_rows(x: mx.array, rows: int) -> mx.array:
    """``(1, n, size)`` ``x`` with zero rows after it, to ``rows``."""
    if x.shape[1] == rows:
        return x
    return mx.concatenate([x, mx.zeros((1, rows - x.shape[1], x.shape[2]), x.dtype)], axis=1)


def _pad(t: mx.array, rows: int) -> mx.array:
    """``t`` with its last token repeated to ``rows``."""
    if t.size == rows:
        return t
    return mx.concatenate([t, mx.repeat(t[-1:], rows - t.size)])


def _merge(layer: list[Any], rows: int) -> Any:
    if isinstance(layer[0], CacheList):
        return CacheList(
            *(_merge([c.caches[i] for c in layer], rows) for i in range(len(layer[0].caches)))
        )
    if isinstance(layer[0], RecurrentCache):
        return RecurrentCache.merge(layer)
    if isinstance(layer[0], HiddenRows):
        return HiddenRows(layer[0].before_norm)  # the batch's states, split after
    return _merge_kv(layer, rows)


def _merge_kv(layer: list[Any], rows: int) -> Any:
    """The sequences' keys left-padded to the longest, with room for ``rows`` more."""
    lengths = [c.offset for c in layer]
    longest = max(lengths)
    padding = [longest - n for n in lengths]
    size = -(-(longest + rows) // BatchKVCache.step) * BatchKVCache.step
    k0, v0 = layer[0].keys, layer[0].values
    assert k0 is not None and v0 is not None
    b, (_, h, _, dk), dv = len(layer), k0.shape, v0.shape[3]
    keys = mx.zeros((b, h, size, dk), k0.dtype)
    values = mx.zeros((b, h, size, dv), v0.dtype)
    for j, (c, pad) in enumerate(zip(layer, padding, strict=True)):
        keys[j : j + 1, :, pad:longest] = c.keys[..., : c.offset, :]
        values[j : j + 1, :, pad:longest] = c.values[..., : c.offset, :]
    batch: Any = BatchKVCache(padding)
    batch.keys, batch.values = keys, values
    batch.offset = batch.offset + longest
    batch._idx = longest
    return batch


def _split(batch: Any, layer: list[Any], rows: int) -> None:
    """Each sequence's part of ``batch`` back into its own cache, after ``rows`` new rows."""
    if isinstance(batch, CacheList):
        for i, part in enumerate(batch.caches):
            _split(part, [c.caches[i] for c in layer], rows)
        return
    if isinstance(batch, RecurrentCache):
        batch.split(layer)
        return
    if isinstance(batch, HiddenRows):
        for j, c in enumerate(layer):
            if batch.rows is not None:
                c.update(batch.rows[j : j + 1])
        return
    end = batch._idx
    for j, c in enumerate(layer):
        pad = end - rows - c.offset  # its left padding: its own keys had not changed
        c.keys = batch.keys[j : j + 1, :, pad:end]
        c.values = batch.values[j : j + 1, :, pad:end]
        c.offset = end - pad
