"""The engine's per-layer caches, made so that every round can go back exactly.

mlx-lm gives a sliding-window layer a ``RotatingKVCache``: a ring of ``window``
rows whose oldest row is overwritten by each new one. Once a reply passes the
window, trimming a round's rejected drafts leaves their rows in the ring, and
the next read takes them for the oldest context, so speculation stopped being
exact there. :class:`WindowKVCache` keeps the rows in order instead, with
:data:`SLACK` rows beyond the window, so that going back up to that many rows
is exact; its buffer slides forward a step at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    RotatingKVCache,
    _BaseCache,
    make_prompt_cache,
)

from app.engine import attention, recurrent
from app.engine.recurrent import FORWARDS, Marked, RecurrentCache, leaves

# Rows a window keeps beyond itself: the most a round or a pad gives back
# (16 drafts verified padded to 32 rows, a prompt chunk's pad under 64).
SLACK = 128
PREFILL_STEP = 512  # prompt tokens a forward reads (:func:`prefill`)


class WindowKVCache(_BaseCache):
    """A sliding-window layer's keys and values, in order, that go back exactly."""

    step = 256

    def __init__(self, window: int, slack: int = SLACK) -> None:
        self.window = window
        self.slack = slack
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0  # tokens read, as for mlx-lm's caches
        self._start = 0  # buffer rows [_start, _end) hold the newest tokens
        self._end = 0
        self._read = 0  # buffer row from which the newest forward's queries read

    def _seen(self) -> int:
        """Earlier rows a new token attends to (the window less itself)."""
        return min(self.offset, self.window - 1)

    def _make_room(self, keys: mx.array, values: mx.array) -> None:
        n = keys.shape[2]
        if self.keys is not None and self.values is not None:
            if self._end + n <= self.keys.shape[2]:
                return
            keep = min(self._end - self._start, self.window - 1 + self.slack)
            old_k = self.keys[..., self._end - keep : self._end, :]
            old_v = self.values[..., self._end - keep : self._end, :]
        else:
            keep, old_k, old_v = 0, None, None
        size = -(-(keep + n + 1) // self.step) * self.step
        b, h, _, dk = keys.shape
        self.keys = mx.zeros((b, h, size, dk), keys.dtype)
        self.values = mx.zeros((b, h, size, values.shape[3]), values.dtype)
        if old_k is not None and old_v is not None and keep:
            self.keys[..., :keep, :] = old_k
            self.values[..., :keep, :] = old_v
        self._start, self._end = 0, keep

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        n = keys.shape[2]
        seen = self._seen()
        self._make_room(keys, values)
        assert self.keys is not None and self.values is not None
        self.keys[..., self._end : self._end + n, :] = keys
        self.values[..., self._end : self._end + n, :] = values
        self._end += n
        self.offset += n
        self._read = self._end - seen - n
        out = self.keys_and_values()
        self._start = max(self._start, self._end - (self.window - 1 + self.slack))
        return out

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        """The rows the newest forward's queries read: what layers sharing this one's keys
        (Gemma 3n's last ones) attend to."""
        assert self.keys is not None and self.values is not None
        rows = slice(self._read, self._end)
        return self.keys[..., rows, :], self.values[..., rows, :]

    def make_mask(self, n: int, window_size: int | None = None, return_array: bool = False) -> Any:
        seen = self._seen()
        window = window_size or self.window
        if n == 1:  # its keys are the window at most
            return None if seen + 1 <= window else mx.arange(seen + 1) >= seen + 1 - window
        if seen + n > window or return_array:
            return create_causal_mask(n, seen, window_size=window)
        return "causal"

    def can_go_back(self, n: int) -> bool:
        """Whether :meth:`trim` of ``n`` rows leaves every row a next token attends to."""
        held = self._end - self._start
        return n <= self.offset and held - n >= min(self.offset - n, self.window - 1)

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(n, self.offset)
        if not self.can_go_back(n):
            raise ValueError(f"a window keeps {self.slack} rows to go back, not {n}")
        self._end -= n
        self.offset -= n
        return n

    def size(self) -> int:
        return min(self.offset, self.window)

    @classmethod
    def rows_held(cls, window: int, tokens: int, slack: int = SLACK) -> int:
        """The most rows its buffer holds at ``tokens``: the window and its slack, with
        room for a prompt chunk, in whole steps."""
        most = -(-(window + slack + PREFILL_STEP) // cls.step) * cls.step
        return min(tokens, most)

    def empty(self) -> bool:
        return self.keys is None

    @property
    def state(self) -> list[mx.array]:
        if self.keys is None or self.values is None:
            return []
        return [self.keys, self.values]

    @state.setter
    def state(self, v: list[mx.array]) -> None:
        raise NotImplementedError("a window's cache is not restored from its buffers")

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return int(self.keys.nbytes + self.values.nbytes)


class ChunkKVCache(ChunkedKVCache):
    """Llama 4's chunked-attention layer: mlx-lm's cache, which keeps the newest chunk's
    worth of rows and, asked to give back more than it holds, gave back what it held.
    It goes back only where the rows of the chunk a next token reads are still held."""

    def __init__(self, chunk_size: int) -> None:
        super().__init__(chunk_size)  # type: ignore[no-untyped-call]

    def can_go_back(self, n: int) -> bool:
        at = self.offset - n
        return n <= 0 or (at >= 0 and self.start_position <= at - at % self.chunk_size)

    def trim(self, n: int) -> int:
        n = min(n, self.offset)
        if not self.can_go_back(n):
            raise ValueError(f"a chunked layer holds rows from {self.start_position}, not {n} back")
        return int(super().trim(n))  # type: ignore[no-untyped-call]


def new_cache(model: nn.Module, forwards: int = FORWARDS) -> list[Any]:
    """``model``'s cache as mlx-lm makes it, plain windows and recurrent states made to go back.

    ``forwards``: how many of its newest forwards a recurrent state can go back
    into, each a state's worth of memory (a target needs its newest round's).
    """
    return [_exact(c, forwards) for c in make_prompt_cache(model)]


def _exact(c: Any, forwards: int) -> Any:
    if type(c) is RotatingKVCache and c.keep == 0:
        return WindowKVCache(c.max_size)
    if type(c) is ArraysCache:
        return RecurrentCache(len(c.cache), forwards=forwards)
    if type(c) is ChunkedKVCache:
        return ChunkKVCache(c.chunk_size)
    if isinstance(c, CacheList):
        c.caches = tuple(_exact(x, forwards) for x in c.caches)
    if (type(c).__module__, type(c).__name__) == (DEEPSEEK_V4, "LayerCache"):
        from app.engine.sparse import SparseCache  # imports that module, present here

        return SparseCache(c.window_size, SLACK)
    return c


# DeepSeek-V4's module, imported only where a model of it is loaded (another mlx-lm may lack it).
DEEPSEEK_V4 = "mlx_lm.models.deepseek_v41"


def can_rewind(cache: Sequence[Any]) -> bool:
    """Whether ``cache`` (fresh from :func:`new_cache`) can give back rejected rows."""
    return all(type(c) is not RotatingKVCache and c.is_trimmable() for c in leaves(cache))


def refusal(model: nn.Module) -> str | None:
    """Why ``model``'s cache cannot give back rejected rows, one line naming its layers, or None."""
    cache = new_cache(model)
    for c in leaves(cache):
        if type(c) is RotatingKVCache:
            return "its sliding-window layers that keep their first rows cannot go back"
        if not c.is_trimmable():
            return f"its layers' caches ({type(c).__name__}) cannot go back"
    return recurrent.refusal(model, cache)


# Layers that hold a bounded stretch of rows, and every kind that says how far it goes back:
# those, and the ones that go back to marked points (recurrent states, DeepSeek-V4's layers).
_HOLDING = (WindowKVCache, ChunkKVCache)
_GOING_BACK = (*_HOLDING, Marked)


def rewind(cache: Sequence[Any], n: int) -> bool:
    """Gives back the newest ``n`` rows of every layer, or changes nothing.

    Returns:
        False when some layer cannot go back that far (a window past its
        slack, a recurrent state past its newest forwards): the caller reads
        the tokens again into a fresh cache.
    """
    if n <= 0:
        return True
    layers = list(leaves(cache))
    if not all(c.can_go_back(n) for c in layers if isinstance(c, _GOING_BACK)):
        return False
    if not can_rewind(cache):
        return False
    for c in layers:
        c.trim(n)
    return True


def mark(cache: Sequence[Any]) -> None:
    """Keeps the recurrent states and sparse layers' rows at this point, for a later
    :func:`back_to` (an edit, a retry)."""
    for c in leaves(cache):
        if isinstance(c, Marked):
            c.mark()


def reachable(cache: Sequence[Any], offset: int) -> int:
    """The greatest row count at most ``offset`` every layer of ``cache`` can go back to."""
    layers = list(leaves(cache))
    at = min(offset, *(c.offset for c in layers)) if layers else offset
    for c in layers:
        if isinstance(c, Marked):
            at = min(at, c.reachable(at))
        elif isinstance(c, _GOING_BACK) and not c.can_go_back(c.offset - at):
            return 0
    return at


def back_to(cache: Sequence[Any], offset: int) -> None:
    """Cuts every layer of ``cache`` back to ``offset`` rows, which :func:`reachable` gave."""
    for c in leaves(cache):
        if isinstance(c, Marked):
            c.back_to(offset)
        else:
            c.trim(c.offset - offset)


@dataclass(frozen=True)
class Layout:
    """What one request's caches in a model hold, by layer: a layer with keys and values
    (its parts in a ``CacheList`` together) holds them for every token or for a window."""

    growing: int  # layers whose keys and values grow with the context
    windows: tuple[int, ...]  # each sliding-window layer's window (a chunked layer's chunk)
    state: int  # bytes of one request's recurrent states (a marked copy holds as much again)


def layout(model: nn.Module) -> Layout:
    """``model``'s caches by kind. Layers that keep no cache of their own (an MLP's, or
    Gemma 3n's that read an earlier layer's keys) count for nothing.

    The states' shapes come from one token's forward that is never evaluated:
    ``model`` may be built from its config alone, its weights never made.
    """
    cache = new_cache(model)
    states = [c for c in leaves(cache) if isinstance(c, RecurrentCache)]
    growing, windows = 0, []
    for layer in cache:
        parts = list(leaves([layer]))
        held = next((c for c in parts if isinstance(c, _HOLDING)), None)
        if held is not None:
            windows.append(held.window if isinstance(held, WindowKVCache) else held.chunk_size)
        elif any(not isinstance(c, RecurrentCache) for c in parts):
            growing += 1
    if states:
        model(mx.array([[0]]), cache=cache)  # shapes only
    return Layout(growing, tuple(windows), sum(c.nbytes for c in states))


def prefill(
    model: nn.Module, cache: list[Any], tokens: Sequence[int], step: int = PREFILL_STEP
) -> None:
    """Runs ``tokens`` through ``model`` into ``cache``, ``step`` at a time (no logits read)."""
    for i in range(0, len(tokens), step):
        rows, pad = attention.padded(tokens[i : i + step], cache)
        model(mx.array(rows)[None], cache=cache)
        if pad:
            rewind(cache, pad)  # the pad's rows are read for their shape only
        mx.eval([c.state for c in cache])
