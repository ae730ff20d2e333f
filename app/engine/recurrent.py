"""Recurrent layers' states that go back exactly, so hybrid targets can verify drafts.

Gated DeltaNet layers (Qwen3.5 / 3.6, Qwen3-Next, Kimi-Linear, OLMo hybrid),
Mamba and Mamba2 layers (Nemotron-H, Falcon-H1, Granite 4, Plamo 2, Jamba) and
short convolutions (LFM2) keep, in mlx-lm's ``ArraysCache``, states that each
token overwrites: a convolution's last few inputs and a recurrent matrix.
Verifying k drafts reads k + 1 rows, so a rejected draft would stay in them.

:class:`RecurrentCache` goes back instead of giving up. While a forward runs,
each of its layers notes what produced the states it writes (:func:`noted`):
the convolution's input (the state after j rows is a slice of it) and the
recurrence's inputs. Going back to j rows of a forward recomputes the
recurrence over those j rows alone from the state before it (no projection,
no matmul: elementwise work on the layer's state) and slices the
convolution's input. A round that keeps every row costs nothing; keeping the
per-position states instead would hold (k + 1) states a layer (a Qwen3.6-27B
shape: 151 MB a position) for what a recomputation of at most k rows gives.

A layer is noted by what mlx-lm's models call: ``gated_delta_update`` and
``ssm_update`` (wrapped where the model's module imported them), a
``Conv1d`` of the model (its class swapped for :class:`_NotedConv1d`), and
Mamba's ``ssm_step`` (its per-token states chained). A state written with no
note cannot be recomputed: that forward cannot be gone back into, and a model
whose layers write such states is refused by :func:`unrewindable`.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache, CacheList

# Rows a recurrent cache can go back: the rows of its newest forwards, up to
# this many (a round's 16 drafts padded to 32 rows; the draft's steps of a round).
DEPTH = 128
# States kept at marked positions (a prompt's end) for a regenerated reply or an edit.
MARKS = 4

_local = threading.local()


def _active() -> RecurrentCache | None:
    return getattr(_local, "active", None)


@dataclass
class _Note:
    """How the state a layer writes after each of a forward's ``rows`` is made."""

    rows: int
    at: Callable[[int], Any] | None  # the state after j rows (0 < j < rows); None: too deep
    made: Any = None  # the final state, for a recurrence's note; None for a convolution's


@dataclass
class _Slot:
    before: Any  # the slot's value before this forward
    note: _Note | None  # None: written with no note (cannot be recomputed)


@dataclass
class _Forward:
    """What one forward wrote into a cache's slots, and how to go back into it."""

    slots: dict[int, _Slot] = field(default_factory=dict)
    rows: int = 0
    convs: list[_Note] = field(default_factory=list)  # noted, not yet matched to a slot
    recurrences: list[_Note] = field(default_factory=list)
    chain: list[Any] = field(default_factory=list)  # Mamba's per-token states, first the one before

    def exact(self) -> bool:
        """Whether every state it wrote can be recomputed at any of its rows."""
        return bool(self.slots) and all(
            s.note is not None and s.note.at is not None and s.note.rows == self.rows
            for s in self.slots.values()
        )


class RecurrentCache(ArraysCache):
    """An ``ArraysCache`` that can give back its newest rows, up to :data:`DEPTH`."""

    def __init__(self, size: int, depth: int = DEPTH) -> None:
        super().__init__(size)
        self.depth = depth
        self.offset = 0  # rows read
        self._forwards: list[_Forward] = []  # closed, newest last
        self._open: _Forward | None = None
        self._marks: list[tuple[int, list[Any]]] = []  # (offset, slots), oldest first

    def __getitem__(self, idx: int) -> Any:
        _local.active = self
        if self._open is not None and idx in self._open.slots:
            self._close()  # read again: the next forward began
        return self.cache[idx]

    def __setitem__(self, idx: int, value: Any) -> None:
        _local.active = self
        if self._open is not None and idx in self._open.slots:
            self._close()
        forward = self._forward()
        slot = forward.slots[idx] = _Slot(self.cache[idx], None)
        self.cache[idx] = value
        made = next((n for n in forward.recurrences if n.made is value), None)
        if made is not None:
            forward.recurrences.remove(made)
            self._fill(forward, slot, made)
        elif forward.chain and forward.chain[-1] is value and len(forward.chain) > 1:
            states = list(forward.chain)
            rows = len(states) - 1
            self._fill(
                forward, slot, _Note(rows, states.__getitem__ if rows <= self.depth else None)
            )
        self._match(forward)

    def _forward(self) -> _Forward:
        if self._open is None:
            self._open = _Forward()
        return self._open

    def noted(self, note: _Note, before: Any = ...) -> None:
        """A layer of this cache made a state: a recurrence's (from ``before``), a convolution's."""
        if before is not ... and not any(before is c for c in self.cache):
            return  # a cache of another kind (mlx-lm's own) ran since this one
        forward = self._forward()
        if note.made is None:
            forward.convs.append(note)
            self._match(forward)
        else:
            forward.recurrences.append(note)

    def stepped(self, before: Any, after: Any) -> None:
        """A per-token recurrence went from ``before`` to ``after`` (Mamba's ``ssm_step``)."""
        forward = self._forward()
        if not forward.chain or forward.chain[-1] is not before:
            forward.chain = [before]
        forward.chain.append(after)

    def _match(self, forward: _Forward) -> None:
        """Pairs convolutions with the slots written without a note, in order."""
        for slot in forward.slots.values():
            if slot.note is None and forward.convs:
                self._fill(forward, slot, forward.convs.pop(0))

    def _fill(self, forward: _Forward, slot: _Slot, note: _Note) -> None:
        if not forward.rows:
            forward.rows = note.rows
            self.offset += note.rows
        slot.note = note

    def _close(self) -> None:
        """Ends the open forward: kept to go back into while within :data:`DEPTH` rows."""
        forward, self._open = self._open, None
        if forward is None or not forward.slots:
            return
        if not forward.exact():
            self._forwards.clear()  # nothing before it can be reached either
            return
        self._forwards.append(forward)
        while sum(f.rows for f in self._forwards) > self.depth:
            self._forwards.pop(0)

    def can_go_back(self, n: int) -> bool:
        """Whether the newest ``n`` rows are within forwards that can be gone back into."""
        if n <= 0:
            return True
        self._close()
        held = 0
        for forward in reversed(self._forwards):
            held += forward.rows
            if held >= n:
                return True
        return False

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Gives back the newest ``n`` rows: their forwards' states before them, recomputed."""
        if n <= 0:
            return 0
        if not self.can_go_back(n):
            raise ValueError(f"a recurrent cache goes back {self.depth} rows at most, not {n}")
        left = n
        while left:
            forward = self._forwards[-1]
            if left >= forward.rows:
                for idx, slot in forward.slots.items():
                    self.cache[idx] = slot.before
                self._forwards.pop()
                left -= forward.rows
                continue
            keep = forward.rows - left
            for idx, slot in forward.slots.items():
                assert slot.note is not None and slot.note.at is not None
                self.cache[idx] = slot.note.at(keep)
                slot.note = _Note(keep, slot.note.at)
            forward.rows, left = keep, 0
        self.offset -= n
        self._marks = [m for m in self._marks if m[0] <= self.offset]
        return n

    def mark(self) -> None:
        """Keeps the state at this offset, so that :meth:`back_to` can return here later."""
        self._close()
        self._marks = [m for m in self._marks if m[0] != self.offset]
        self._marks = [*self._marks, (self.offset, list(self.cache))][-MARKS:]

    def reachable(self, offset: int) -> int:
        """The greatest offset at most ``offset`` this cache can go back to (0: from scratch)."""
        if offset >= self.offset:
            return self.offset
        if self.can_go_back(self.offset - offset):
            return offset
        return max((m for m, _ in self._marks if m <= offset), default=0)

    def back_to(self, offset: int) -> None:
        """Goes back to ``offset``, which :meth:`reachable` gave."""
        if offset == self.offset:
            return
        if self.can_go_back(self.offset - offset):
            self.trim(self.offset - offset)
            return
        state = next((s for m, s in self._marks if m == offset), None)
        if state is None:
            if offset:
                raise ValueError(f"no state kept at row {offset}")
            state = [None] * len(self.cache)
        self._forwards.clear()
        self.cache = list(state)
        self.offset = offset
        self._marks = [m for m in self._marks if m[0] <= offset]

    def marked_bytes(self) -> int:
        """Bytes the marked states hold beyond the current one."""
        current = {id(a) for a in self.cache}
        seen: set[int] = set()
        total = 0
        for _, state in self._marks:
            for a in state:
                if a is not None and id(a) not in current and id(a) not in seen:
                    seen.add(id(a))
                    total += a.nbytes
        return total

    @property
    def nbytes(self) -> int:
        arrays: list[Any] = self.cache
        return sum(int(a.nbytes) for a in arrays if a is not None)


def leaves(cache: Sequence[Any]) -> Iterator[Any]:
    """Every layer's cache, those inside a ``CacheList`` included."""
    for c in cache:
        if isinstance(c, CacheList):
            yield from leaves(c.caches)
        else:
            yield c


def _note(rows: int, at: Callable[[int], Any], made: Any = None, before: Any = ...) -> None:
    cache = _active()
    if cache is not None:
        cache.noted(_Note(rows, at if rows <= cache.depth else None, made), before)


def _recurrence(fn: Callable[..., Any], timed: tuple[str, ...]) -> Callable[..., Any]:
    """``fn`` (returning ``(output, state)``), noting how to recompute its state after j rows.

    ``timed`` names the arguments whose second axis is the rows.
    """
    signature = inspect.signature(fn)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        if _active() is None:
            return out
        bound = signature.bind(*args, **kwargs)
        rows = bound.arguments[timed[0]].shape[1]

        def at(j: int) -> Any:
            cut = dict(bound.arguments)
            for name in timed:
                if cut.get(name) is not None:
                    cut[name] = cut[name][:, :j]
            return fn(**cut)[1]

        _note(rows, at, made=out[1], before=bound.arguments.get("state"))
        return out

    recorded.__wrapped__ = fn  # type: ignore[attr-defined]
    return recorded


# The recurrences mlx-lm's hybrid models call, and their arguments along the rows.
RECURRENCES = {
    "gated_delta_update": ("q", "k", "v", "a", "b", "mask"),
    "ssm_update": ("hidden_states", "B", "C", "dt", "mask"),
}


class _NotedConv1d(nn.Conv1d):
    """A model's ``Conv1d``: notes its input, of which each state is a slice."""

    def __call__(self, x: mx.array) -> mx.array:
        width = self.weight.shape[1] - 1
        rows = x.shape[1] - width
        if rows > 0:
            _note(rows, lambda j: x[:, j : j + width])
        out: mx.array = super().__call__(x)  # type: ignore[no-untyped-call]
        return out


def _stepped(step: Callable[..., Any]) -> Callable[..., Any]:
    """Mamba's ``ssm_step``: over a forward's rows (Jamba's), or one token at a time, chained."""

    def recorded(x: mx.array, A: mx.array, state: mx.array | None = None) -> Any:  # noqa: N803
        y, new = step(x, A, state)
        cache = _active()
        if cache is None:
            return y, new
        if x.ndim == 3:  # (batch, rows, channels)
            _note(x.shape[1], lambda j: step(x[:, :j], A, state)[1], made=new, before=state)
        else:
            cache.stepped(state, new)
        return y, new

    recorded.__wrapped__ = step  # type: ignore[attr-defined]
    return recorded


def install(model: nn.Module) -> None:
    """Notes ``model``'s recurrent layers' states: its convolutions and its modules' recurrences."""
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if not name.startswith("mlx_lm.models."):
            continue
        for fn, timed in RECURRENCES.items():
            current = getattr(module, fn, None)
            if callable(current) and not hasattr(current, "__wrapped__"):
                setattr(module, fn, _recurrence(current, timed))
    for _, child in model.named_modules():
        if type(child) is nn.Conv1d:
            child.__class__ = _NotedConv1d
        step = getattr(child, "ssm_step", None)
        if callable(step) and not hasattr(step, "__wrapped__"):
            child.ssm_step = _stepped(step)


# mlx-lm's model modules whose recurrent states are all noted, each read by
# tests/engine/test_hybrids.py: their caches go back exactly.
REWOUND = frozenset(
    {
        "qwen3_5",
        "qwen3_next",
        "kimi_linear",
        "nemotron_h",
        "granitemoehybrid",
        "falcon_h1",
        "jamba",
        "lfm2",
    }
)
# The layers of the others that keep a state, as a refusal names them.
KINDS = {
    "rwkv7": "RWKV-7 time-mixing",
    "recurrent_gemma": "RG-LRU",
    "bailing_moe_linear": "gated linear attention",
    "bailing_hybrid": "gated linear attention",
    "mamba": "Mamba",
    "mamba2": "Mamba2",
    "plamo2": "Mamba (Plamo 2)",
    "olmo_hybrid": "Gated DeltaNet (OLMo hybrid)",
    "baichuan_m1": "short-convolution attention",
}


def refusal(model: nn.Module, cache: Sequence[Any]) -> str | None:
    """Why ``model``'s recurrent states cannot go back, in one line naming its layers; or None."""
    if not any(isinstance(c, RecurrentCache) for c in leaves(cache)):
        return None
    module = type(model).__module__.rsplit(".", 1)[-1]
    if module in REWOUND:
        return None
    return f"its {KINDS.get(module, module)} layers keep a state that cannot be given back"
