"""DeepSeek-V4's compressed sparse attention, its cache made to go back exactly.

Each layer of mlx-lm's ``deepseek_v41`` keeps, in a ``LayerCache``, a window of
its newest rows, the latents of closed groups of ``ratio`` rows (and, in index
layers, their index keys), and the projected rows of the group still open. A
verification's rejected rows would stay in all three. :class:`SparseCache`
goes back instead:

- the window keeps :data:`~app.engine.caches.SLACK` rows beyond itself, while
  the model reads exactly the window it would;
- closed groups depend on their own rows only, so after ``n`` rows there are
  ``n // ratio`` of them: going back cuts the list;
- the open group's rows are the compressor's projections, noted as it reads
  them (:func:`install`), the newest slack's worth kept.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.deepseek_v41 import Compressor, LayerCache

from app.engine.recurrent import Marked, wrapped

_local = threading.local()


def _cat(rows: mx.array | None, new: mx.array) -> mx.array:
    return new if rows is None else mx.concatenate([rows, new], axis=1)


def exact(cache: Any, slack: int) -> SparseCache | None:
    """A :class:`SparseCache` for mlx-lm's DeepSeek-V4 layer ``cache``, keeping ``slack``
    rows to go back; None for any other cache."""
    return SparseCache(cache.window_size, slack) if type(cache) is LayerCache else None


class SparseCache(LayerCache, Marked["_Mark"]):
    """A DeepSeek-V4 layer's cache that gives back rows exactly (see the module's notes)."""

    # mlx-lm's class starts these as None, unannotated, so mypy takes them for None alone.
    window: mx.array | None  # type: ignore[assignment]
    compress_kv: mx.array | None  # type: ignore[assignment]
    index_k: mx.array | None  # type: ignore[assignment]
    pending_kv: mx.array | None  # type: ignore[assignment]
    pending_gate: mx.array | None  # type: ignore[assignment]

    def __init__(self, window_size: int, slack: int) -> None:
        super().__init__(window_size)
        self.slack = slack
        self.ratio = 0  # the layer's compression, told by its compressor (0: none seen)
        self._rows: mx.array | None = None  # the window and up to `slack` rows before it
        self._projected: tuple[mx.array, mx.array] | None = None  # the open group's and before
        self._marks: list[tuple[int, _Mark]] = []

    def update_window(self, kv: mx.array) -> mx.array:
        before = 0 if self.window is None else self.window.shape[1]
        rows = _cat(self._rows, kv)
        self._rows = rows[:, -(self.window_size + self.slack) :]
        self.window = rows[:, -self.window_size :]
        self.offset += kv.shape[1]
        return rows[:, -(before + kv.shape[1]) :]

    def note(self, ratio: int, kv: mx.array | None, gate: mx.array | None) -> None:
        """The compressor's ``ratio`` and the rows it projected this forward (a group's)."""
        self.ratio = ratio
        if kv is None or gate is None:
            return
        keep = self.slack + ratio
        old = self._projected
        self._projected = (
            _cat(None if old is None else old[0], kv)[:, -keep:],
            _cat(None if old is None else old[1], gate)[:, -keep:],
        )

    @property
    def state(self) -> tuple[mx.array | None, ...]:
        """mlx-lm's parts and the rows kept to go back, so that evaluating it evaluates all."""
        kept = (self._rows, *(self._projected or ()))
        return (*super().state, *kept)

    def is_trimmable(self) -> bool:
        return True

    def can_go_back(self, n: int) -> bool:
        """Whether the rows of the last ``n`` tokens can be given back exactly."""
        at = self.offset - n
        if n <= 0:
            return True
        if at < 0:
            return False
        held = 0 if self._rows is None else self._rows.shape[1]
        if held - n < min(self.window_size, at):
            return False
        if self.ratio > 1:  # the open group's rows must still be held
            projected = 0 if self._projected is None else self._projected[0].shape[1]
            return self.offset - projected <= at - at % self.ratio
        # Every row a group of its own, or no compressor; an unnoted one's rows are lost.
        return self.ratio == 1 or (self.compress_kv is None and self.pending_kv is None)

    def trim(self, n: int) -> int:
        n = min(n, self.offset)
        if not self.can_go_back(n):
            raise ValueError(f"a compressed sparse attention layer cannot give back {n} rows")
        if n <= 0:
            return 0
        at = self.offset - n
        assert self._rows is not None
        self._rows = self._rows[:, : self._rows.shape[1] - n]
        self.window = self._rows[:, -min(self.window_size, at) :] if at else None
        self._keep_groups(at)
        if self._projected is not None:
            kv, gate = self._projected
            start = kv.shape[1] - (self.offset - (at - at % self.ratio))
            end = kv.shape[1] - n
            self.pending_kv, self.pending_gate = kv[:, start:end], gate[:, start:end]
            self._projected = (kv[:, :end], gate[:, :end])
        self.offset = at
        self._forget_past()
        return n

    def _kept(self) -> _Mark:
        """The window's and the open group's rows (later rows only add closed groups)."""
        return _Mark(self._rows, self._projected, self.pending_kv, self.pending_gate)

    def _restore(self, kept: _Mark | None, offset: int) -> None:
        kept = kept or _Mark(None, None, None, None)
        self._rows, self._projected = kept.rows, kept.projected
        self.pending_kv, self.pending_gate = kept.pending_kv, kept.pending_gate
        self.window = None if kept.rows is None else kept.rows[:, -self.window_size :]
        self._keep_groups(offset)

    def _keep_groups(self, offset: int) -> None:
        """Cuts the closed groups (and their index keys) to those of ``offset`` rows."""
        groups = offset // self.ratio if self.ratio else 0
        if self.compress_kv is not None:
            self.compress_kv = self.compress_kv[:, :groups] if groups else None
        if self.index_k is not None:
            self.index_k = self.index_k[:, :groups] if groups else None


@dataclass(frozen=True, slots=True)
class _Mark:
    """What a :class:`SparseCache` keeps at a marked point beside its closed groups."""

    rows: mx.array | None
    projected: tuple[mx.array, mx.array] | None
    pending_kv: mx.array | None
    pending_gate: mx.array | None


def _noted_compressor(
    forward: Any, compressor: Any, x: mx.array, start_pos: int, cache: Any
) -> Any:
    """A compressor's forward, its ratio and projected rows told to the cache it reads."""
    outer, _local.projected = getattr(_local, "projected", None), []
    try:
        out = forward(compressor, x, start_pos, cache)
        projected = _local.projected
    finally:
        _local.projected = outer
    if isinstance(cache, SparseCache):
        kv, gate = projected[:2] if compressor.ratio > 1 else (None, None)
        cache.note(int(compressor.ratio), kv, gate)
    return out


def _noted_projection(forward: Any, linear: Any, x: mx.array) -> Any:
    """A compressor's projection, its output noted for the compressor's forward."""
    out = forward(linear, x)
    noted = getattr(_local, "projected", None)
    if noted is not None:
        noted.append(out)
    return out


_NOTING: dict[type, type] = {}


def install(model: nn.Module) -> None:
    """Notes what ``model``'s DeepSeek-V4 compressors read; other models are left as they are."""
    for _, child in model.named_modules():
        if isinstance(child, Compressor):
            child.__class__ = wrapped(type(child), _NOTING, _noted_compressor)
            for name in ("kv_proj", "gate_proj"):
                if (linear := getattr(child, name, None)) is not None:
                    linear.__class__ = wrapped(type(linear), _NOTING, _noted_projection)
