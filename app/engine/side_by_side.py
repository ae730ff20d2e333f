"""The target's caches of a batch kept side by side from round to round.

A packed forward (:mod:`app.engine.packed`) attends per sequence, over each
sequence's own cache, trimmed to what it accepted. On MLX's CUDA backend
that layout costs more when the cache lengths are new: a 70B's round of 2
sequences of 16 rows took 246 ms on lengths never seen before against 132 ms
on the same lengths again, where the same rounds side by side took 135 ms
both times (run 19 in docs/benchmarks-history.md). :class:`SideBySide` keeps the
sequences in one ``(count, heads, columns, dim)`` array per layer: each round's
new rows take shared columns after the last round's, the rows a sequence
rejects stay in place masked out instead of being trimmed, and when the columns
run out each sequence's kept columns move to the front (a compaction). Every
sequence attends in one call a layer, over a key length that changes only
when the columns grow.

mlx-lm's ``BatchKVCache`` also keeps sequences in one array with a RoPE offset
per row, but its rows advance together (left padding, one write column per
step, trimmed alike); rounds that accept a different number of rows per
sequence leave holes, so this masks them and compacts. The layout and the
step are the draft's (:class:`app.engine.stacked.Stack`), kept across rounds.

A round verifies through :func:`app.engine.stacked.stacked_step`, then
:meth:`SideBySide.settle` says what each sequence kept;
:meth:`SideBySide.restore` gives each sequence its own cache back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from app.engine.attention import BUCKET
from app.engine.stacked import Stack

ROOM = 256  # new columns laid out beyond the longest sequence, and added when they run out


class SideBySide(Stack):
    """Several sequences' per-layer caches side by side, kept across rounds.

    While it lives it holds the sequences' caches: theirs are emptied (so
    memory holds one copy) until :meth:`restore`.

    Args:
        caches: Each sequence's per-layer ``KVCache`` (none empty).
        room: New columns to lay out beyond the longest.
    """

    def __init__(self, caches: Sequence[list[Any]], room: int = ROOM) -> None:
        super().__init__(caches, room)
        self.col = self.base  # the next free shared column
        self.valid = mx.arange(self.size)[None, :] < self._lengths[:, None]
        self.compactions = 0
        self._starts: list[int] = []  # each sequence's first new column in the open round
        for cache in caches:
            for c in cache:
                c.keys = c.values = None

    def begin(self, rows: Sequence[int]) -> tuple[int, mx.array, mx.array]:
        """Takes the columns of a round of ``rows[i]`` new rows per sequence.

        Each sequence's rows end at the round's last column (a shorter one's
        first columns are padding, masked). Returns the round's first column,
        each sequence's RoPE offset (of the round's first row, padding
        included) and the ``(count, 1, r, size)`` mask, r the most rows.
        """
        r = max(rows)
        if self.col + r > self.size:
            self.compact()
        if self.col + r > self.size:
            self.grow(r)
        col = self.col
        self._starts = [col + r - n for n in rows]
        offsets, mask = self._offsets(rows), self._mask(self.valid, col, r, self._starts)
        self.col += r
        return col, offsets, mask

    def settle(self, kept: Sequence[int]) -> None:
        """After a round: sequence j keeps the first ``kept[j]`` of its new rows."""
        cols = mx.arange(self.size)[None, :]
        starts = mx.array(self._starts)[:, None]
        ends = starts + mx.array(list(kept))[:, None]
        self.valid = self.valid | ((cols >= starts) & (cols < ends))
        self._positions = [p + n for p, n in zip(self._positions, kept, strict=True)]

    def _order(self) -> mx.array:
        """Per sequence, its columns with the kept ones first, each part in its own order."""
        cols = mx.arange(self.size)[None, :]
        return mx.argsort(mx.where(self.valid, cols, cols + self.size), axis=1)

    def compact(self) -> None:
        """Moves each sequence's kept columns to the front of its row."""
        self.compactions += 1
        idx = self._order()[:, None, :, None]
        self.keys = [mx.take_along_axis(k, idx, axis=2) for k in self.keys]
        self.values = [mx.take_along_axis(v, idx, axis=2) for v in self.values]
        self.valid = mx.arange(self.size)[None, :] < mx.array(self._positions)[:, None]
        self.col = max(self._positions)
        mx.eval(self.keys, self.values, self.valid)

    def grow(self, r: int) -> None:
        """Lays out more columns, :data:`ROOM` at least, a whole number of buckets."""
        more = max(ROOM, -(-(self.col + r - self.size) // BUCKET) * BUCKET)
        pad = [(0, 0), (0, 0), (0, more), (0, 0)]
        self.keys = [mx.pad(k, pad) for k in self.keys]
        self.values = [mx.pad(v, pad) for v in self.values]
        self.valid = mx.pad(self.valid, [(0, 0), (0, more)])
        self.size += more
        mx.eval(self.keys, self.values, self.valid)

    def front(self, index: int, n: int) -> list[tuple[mx.array, mx.array]]:
        """Sequence ``index``'s first ``n`` rows, keys and values of every layer.

        Only rows the sequence held when laid out and never rejected, such as
        its prompt's: those stay in front, since a compaction keeps the kept
        columns in order.
        """
        return [
            (k[index : index + 1, :, :n, :], v[index : index + 1, :, :n, :])
            for k, v in zip(self.keys, self.values, strict=True)
        ]

    def restore(self, caches: Sequence[list[Any]]) -> None:
        """Gives each sequence its own cache back: its kept columns, in order.

        ``caches`` are the ones the stack was made of, in the same order;
        the stack is spent after.
        """
        order = self._order()
        for j, cache in enumerate(caches):
            n = self._positions[j]
            idx = order[j, :n]
            for i, c in enumerate(cache):
                c.keys = mx.take(self.keys[i][j : j + 1], idx, axis=2)
                c.values = mx.take(self.values[i][j : j + 1], idx, axis=2)
                c.offset = n
        mx.eval([c.state for cache in caches for c in cache])
        self.keys, self.values = [], []


__all__ = ["ROOM", "SideBySide"]
