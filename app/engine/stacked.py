"""Draft steps of several sequences with one attention call per layer.

A packed forward (:mod:`app.engine.packed`) attends per sequence: for a small,
launch-bound draft that is most of a step's graph (a 1B's step of 8
sequences cost 18.2 ms packed on MLX's CUDA backend, against 9.4 ms with the
sequences side by side in one attention call). So for a round's draft steps the
sequences' caches are laid side by side once per round in a :class:`Stack`:
each sequence's keys at the front of its row, padding masked, and the new
rows of every sequence in shared columns after the longest. The first step
feeds each sequence what it committed in the last round (one or a few
tokens, right-aligned); the others one token each. The projections and the MLP still see
every row as one matrix. When the steps are done, each sequence's new rows
go back into its own cache (:meth:`Stack.write_back`).

Only the draft runs this way: its steps need not match the packed path's
arithmetic bit for bit, since the target verifies what it proposes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from app.engine.attention import BUCKET
from app.engine.packed import head, packable

# RoPE modules that take one offset per sequence (an array) as MLX's fast rope does.
_ROPES = frozenset({"RoPE", "Llama3RoPE"})
# A stack is a copy of its sequences' caches padded to the longest; past this many times
# their own size it is not made, so it never holds more than that (memory fit counts it).
SLACK = 2


def stackable(model: nn.Module, caches: Sequence[list[Any]] | None = None) -> bool:
    """Whether ``model``'s steps can run stacked, and where given, on these ``caches``.

    The model must be packable with a RoPE that takes one offset per
    sequence; the caches plain KV caches of several sequences, none empty,
    none so much longer than the rest that the stack's padding would take
    it past :data:`SLACK` times their own size.
    """
    from mlx_lm.models.cache import KVCache

    if not packable(model):
        return False
    if type(model.model.layers[0].self_attn.rope).__name__ not in _ROPES:
        return False
    if caches is None:
        return True
    if len(caches) < 2 or not all(
        type(c) is KVCache and c.offset > 0 for cache in caches for c in cache
    ):
        return False
    lengths: list[int] = [cache[0].offset for cache in caches]
    return len(lengths) * max(lengths) <= SLACK * sum(lengths)


class Stack:
    """Several sequences' per-layer caches side by side, for steps of one or a few rows each.

    Each sequence's keys lie at the front of its row. The new rows of every
    sequence take shared columns after the longest; where a step gives
    sequences different numbers of rows (a round's first step feeds each what
    it committed), each sequence's rows end at the step's last column, so its
    new rows stay contiguous, and the columns before them are masked.

    Args:
        caches: Each sequence's per-layer ``KVCache`` (as ``make_prompt_cache``
            makes; none empty).
        columns: The most new columns the steps will take.
    """

    def __init__(self, caches: Sequence[list[Any]], columns: int) -> None:
        lengths: list[int] = [cache[0].offset for cache in caches]
        self.count = len(caches)
        self.base = max(lengths)  # the first column of new rows
        self.size = -(-(self.base + columns) // BUCKET) * BUCKET  # few key lengths, few kernels
        self.taken = 0  # new columns taken so far
        self._lengths = mx.array(lengths, dtype=mx.int32)
        self._positions = list(lengths)  # each sequence's position of its next token
        self._start: list[int] | None = None  # each sequence's first new column, once known
        self.keys = [self._lay([c[i].keys for c in caches], lengths) for i in range(len(caches[0]))]
        self.values = [
            self._lay([c[i].values for c in caches], lengths) for i in range(len(caches[0]))
        ]

    def _lay(self, parts: Sequence[mx.array], lengths: Sequence[int]) -> mx.array:
        rows = [
            mx.pad(p[..., :n, :], [(0, 0), (0, 0), (0, self.size - n), (0, 0)])
            for p, n in zip(parts, lengths, strict=True)
        ]
        return mx.concatenate(rows, axis=0)

    @property
    def left(self) -> int:
        """New columns still free."""
        return self.size - self.base - self.taken

    def begin(self, rows: Sequence[int]) -> tuple[int, mx.array, mx.array]:
        """Takes the columns of a step of ``rows[i]`` new rows per sequence.

        Returns:
            The step's first column, each sequence's RoPE offset (of the
            step's first row, padding included) and the ``(count, 1, r, size)``
            mask, r the most rows.

        Raises:
            ValueError: No room is left, or the rows differ after the first step.
        """
        r = max(rows)
        if r > self.left:
            raise ValueError("the stack has no column left")
        if self._start is not None and any(n != r for n in rows):
            raise ValueError("only a stack's first step may give sequences different rows")
        col = self.base + self.taken
        if self._start is None:
            self._start = [col + r - n for n in rows]
        own = mx.arange(self.size)[None, :] < self._lengths[:, None]
        offsets, mask = self._offsets(rows), self._mask(own, col, r, self._start)
        self._positions = [p + n for p, n in zip(self._positions, rows, strict=True)]
        self.taken += r
        return col, offsets, mask

    def _offsets(self, rows: Sequence[int]) -> mx.array:
        """Each sequence's RoPE offset of a step's first row, its padding rows included."""
        r = max(rows)
        return mx.array([p - (r - n) for p, n in zip(self._positions, rows, strict=True)])

    def _mask(self, own: mx.array, col: int, r: int, starts: Sequence[int]) -> mx.array:
        """The ``(count, 1, r, size)`` mask of a step of ``r`` rows from column ``col``.

        A query row sees the ``(count, size)`` columns ``own`` and its
        sequence's new columns from ``starts[j]`` up to its own.
        """
        cols = mx.arange(self.size)[None, None, :]
        last = col + mx.arange(r)[None, :, None]  # the last column each query row may see
        start = mx.array(list(starts))[:, None, None]
        return (own[:, None, :] | ((cols >= start) & (cols <= last)))[:, None]

    def write_back(self, caches: Sequence[list[Any]], rows: Sequence[int]) -> None:
        """Appends each sequence's first ``rows[i]`` new rows to its own cache."""
        starts = self._start or [self.base] * self.count
        for j, (cache, n, s) in enumerate(zip(caches, rows, starts, strict=True)):
            if n <= 0:
                continue
            span = slice(s, s + n)
            for i, c in enumerate(cache):
                c.update_and_fetch(
                    self.keys[i][j : j + 1, :, span, :], self.values[i][j : j + 1, :, span, :]
                )


def stacked_step(model: nn.Module, tokens: Sequence[mx.array], stack: Stack) -> mx.array:
    """One step of every sequence on ``stack``.

    Args:
        model: A model :func:`stackable` accepts.
        tokens: Each sequence's new tokens (lazy is fine): one each, or on a
            stack's first step one or a few.
        stack: The sequences' caches side by side; the step takes its next columns.

    Returns:
        ``(count, r, vocab)`` logits, r the most new tokens of a sequence;
        each sequence's last new token's at ``[j, -1]``.
    """
    rows = [t.size for t in tokens]
    r = max(rows)
    if r == 1:
        x = mx.concatenate(list(tokens)).astype(mx.int32)
    else:  # each sequence's tokens at the end of its r rows; the front is padding
        x = mx.concatenate(
            [
                mx.concatenate([mx.zeros((r - t.size,), mx.int32), t.astype(mx.int32)])
                for t in tokens
            ]
        )
    col, offsets, mask = stack.begin(rows)
    inner = model.model
    h = inner.embed_tokens(x[None])
    for i, layer in enumerate(inner.layers):
        h = h + _attention(
            layer.self_attn, layer.input_layernorm(h), stack, i, (col, r), mask, offsets
        )
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return head(model, inner.norm(h)).reshape(stack.count, r, -1)


def _attention(
    attn: Any,
    x: mx.array,
    stack: Stack,
    i: int,
    span: tuple[int, int],
    mask: mx.array,
    offsets: mx.array,
) -> mx.array:
    """Projections over every row as one matrix, attention of all sequences in one call."""
    d, (col, r) = stack.count, span
    q = attn.q_proj(x).reshape(d, r, attn.n_heads, -1).transpose(0, 2, 1, 3)
    k = attn.k_proj(x).reshape(d, r, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    v = attn.v_proj(x).reshape(d, r, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    q = attn.rope(q, offset=offsets)
    k = attn.rope(k, offset=offsets)
    stack.keys[i][..., col : col + r, :] = k
    stack.values[i][..., col : col + r, :] = v
    o = mx.fast.scaled_dot_product_attention(
        q, stack.keys[i], stack.values[i], scale=attn.scale, mask=mask
    )
    y: mx.array = attn.o_proj(o.transpose(0, 2, 1, 3).reshape(1, d * r, -1))
    return y


__all__ = ["SLACK", "Stack", "stackable", "stacked_step"]
