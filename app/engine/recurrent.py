"""Recurrent layers' states that go back exactly, so hybrid targets can verify drafts.

Gated DeltaNet layers (Qwen3.5 / 3.6, Qwen3-Next, Kimi-Linear, Kimi K3, Ling 2.5, OLMo
hybrid), Mamba2 and Mamba layers (Nemotron-H, Falcon-H1, Granite 4, Jamba, Plamo 2,
Mamba-Codestral, Falcon-Mamba), short convolutions (LFM2, LFM2-MoE, Baichuan-M1's key and
value taps), lightning attention (Ling), RG-LRU (RecurrentGemma), RWKV-7's time mixing and
LongCat-Flash's n-gram embedding keep, in mlx-lm's ``ArraysCache``, states that each row
overwrites: a layer's last few inputs and a recurrent matrix. Verifying k drafts reads
k + 1 rows, so a rejected draft would stay in them.

:class:`RecurrentCache` goes back instead. While a forward runs, each of its
layers notes how the states it writes are made: the convolution's input (the
state after j rows is a slice of it) and the recurrence's inputs. Off Metal
mlx-lm runs the Gated DeltaNet recurrence a row at a time (:func:`_stepwise`
keeps each row's state while its forward is the newest); otherwise going back
to j rows recomputes the recurrence over those rows alone from the state
before the forward (no projection, no matmul). A round that keeps every row
costs nothing. docs/architecture.md says why, with what each method measured.

A layer is noted through what mlx-lm's models call: the recurrences of
:data:`RECURRENCES` (wrapped where the model's module imported them) and
:data:`METHODS`, a ``Conv1d`` of the model (its class swapped for
:class:`_NotedConv1d`), the modules of :data:`_LAST_INPUTS`, Baichuan-M1's taps
and Jamba's and Mamba's ``ssm_step``. A state written with no note cannot be
recomputed: that forward cannot be gone back into, and :func:`refusal` names the
models whose layers may write such states.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from mlx_lm.models.cache import ArraysCache, CacheList

from app.engine import delta_kernel

# Rows a recurrent cache can go back: the rows of its newest forwards, up to
# this many (a round's 16 drafts padded to 32 rows; the draft's steps of a round).
DEPTH = 128
# States kept at marked positions (a prompt's end) for a regenerated reply or an edit.
MARKS = 4
# A forward of at most this many rows keeps its state after each row off Metal
# (a round's 16 drafts and the token before them); a longer one recomputes.
ROWS_KEPT = 17
# Forwards a cache can go back into, each holding the state before it: a draft's
# round (its first step and up to 16 more); a target goes back into its newest
# round only, and keeps TARGET_FORWARDS. Within them, a state each; beyond, marks.
FORWARDS = ROWS_KEPT + 1
TARGET_FORWARDS = 2

_local = threading.local()
S = TypeVar("S")  # what a marked point keeps


def _active() -> RecurrentCache | None:
    return getattr(_local, "active", None)


@dataclass
class _Note:
    """How the state a layer writes after each of a forward's ``rows`` is made."""

    rows: int
    at: Callable[[int], Any] | None  # the state after j rows (0 < j < rows); None: too deep
    made: Any = None  # the final state, for a recurrence's note; None for a convolution's
    again: Callable[[int], Any] | None = None  # ``at`` once kept states are let go

    def age(self) -> None:
        """Lets go of states kept per row: going back into an older forward recomputes."""
        if self.again is not None:
            self.at, self.again = self.again, None

    def row(self, j: int) -> _Note:
        """The note of sequence ``j`` of the batch this note's forward ran."""

        def pick(at: Callable[[int], Any] | None) -> Callable[[int], Any] | None:
            if at is None:
                return None
            return lambda n: tree_map(lambda a: a[j : j + 1], at(n))

        return _Note(self.rows, pick(self.at), None, pick(self.again))


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

    def exact(self) -> bool:
        """Whether every state it wrote can be recomputed at any of its rows."""
        return bool(self.slots) and all(
            s.note is not None and s.note.at is not None and s.note.rows == self.rows
            for s in self.slots.values()
        )


class Marked(Generic[S]):
    """A cache that goes back past its newest rows to marked points (a prompt's end, for a
    retry or an edit), keeping what it needs at each of its :data:`MARKS` newest.

    A subclass says how far it goes back alone (``can_go_back``, ``trim``, which calls
    :meth:`_forget_past`), what a point needs (``_kept``) and how it returns there
    (``_restore``).
    """

    offset: int
    _marks: list[tuple[int, S]]  # (offset, what it needs), oldest first

    def can_go_back(self, n: int) -> bool:
        raise NotImplementedError

    def trim(self, n: int) -> int:
        raise NotImplementedError

    def _kept(self) -> S:
        """What going back to this offset needs."""
        raise NotImplementedError

    def _restore(self, kept: S | None, offset: int) -> None:
        """Returns to ``offset`` from what was ``kept`` there (None: back to nothing read)."""
        raise NotImplementedError

    def _forget_past(self) -> None:
        """Lets go of the marks past the offset: the rows there may be read anew."""
        self._marks = [m for m in self._marks if m[0] <= self.offset]

    def mark(self) -> None:
        """Keeps what this offset needs, so that :meth:`back_to` can return here later."""
        kept = self._kept()
        self._marks = [*(m for m in self._marks if m[0] != self.offset), (self.offset, kept)]
        self._marks = self._marks[-MARKS:]

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
        kept = next((k for m, k in self._marks if m == offset), None)
        if kept is None and offset:
            raise ValueError(f"nothing kept at row {offset}")
        self._restore(kept, offset)
        self.offset = offset
        self._forget_past()


class RecurrentCache(ArraysCache, Marked[list[Any]]):
    """An ``ArraysCache`` that can give back its newest rows: those of its newest
    ``forwards`` forwards, up to :data:`DEPTH` rows, and go back to marked points."""

    def __init__(self, size: int, depth: int = DEPTH, forwards: int = FORWARDS) -> None:
        super().__init__(size)
        self.depth = depth
        self.forwards = forwards
        self.offset = 0  # rows read
        self._forwards: deque[_Forward] = deque()  # closed, newest last
        self._held = 0  # their rows
        self._open: _Forward | None = None
        self._marks: list[tuple[int, list[Any]]] = []  # (offset, slots)

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
        self._match(forward)

    def _forward(self) -> _Forward:
        if self._open is None:
            if self._forwards:  # the newest until now: each is aged once, as it stops being
                for slot in self._forwards[-1].slots.values():
                    if slot.note is not None:
                        slot.note.age()
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
            self._held = 0
            return
        self._forwards.append(forward)
        self._held += forward.rows
        while self._held > self.depth or len(self._forwards) > self.forwards:
            self._held -= self._forwards.popleft().rows

    @classmethod
    def merge(cls, caches: Sequence[RecurrentCache]) -> RecurrentCache:
        """One cache holding ``caches``' states as a batch, for one forward of them all."""
        first = caches[0]
        out = cls(len(first.cache), first.depth, first.forwards)
        own: list[list[Any]] = [c.cache for c in caches]
        states: list[Any] = [mx.concatenate([c[i] for c in own]) for i in range(len(own[0]))]
        out.cache = cast(Any, states)
        return out

    def split(self, caches: Sequence[RecurrentCache]) -> None:
        """Hands each of ``caches`` (merged here, in order) its part of the forward run here.

        Each goes back into it as into a forward of its own; where this one's
        states were written with no note, none of them can.
        """
        forward, merged = self._open, cast(list[Any], self.cache)
        for j, own in enumerate(caches):
            own._close()
            part = own._forward()
            for idx, slot in (forward.slots if forward is not None else {}).items():
                note = slot.note.row(j) if slot.note is not None else None
                part.slots[idx] = _Slot(own.cache[idx], note)
                own.cache[idx] = merged[idx][j : j + 1]
            part.rows = forward.rows if forward is not None else 0
            own.offset += part.rows
            own._close()

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
        """Gives back the newest ``n`` rows: the states before them, kept or recomputed."""
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
                self._held -= forward.rows
                left -= forward.rows
                continue
            keep = forward.rows - left
            for idx, slot in forward.slots.items():
                assert slot.note is not None and slot.note.at is not None
                self.cache[idx] = slot.note.at(keep)
                slot.note.rows = keep
            self._held -= forward.rows - keep
            forward.rows, left = keep, 0
        self.offset -= n
        self._forget_past()
        return n

    def _kept(self) -> list[Any]:
        self._close()
        return list(self.cache)

    def _restore(self, kept: list[Any] | None, offset: int) -> None:
        self._forwards.clear()
        self._held = 0
        self.cache = list(kept) if kept is not None else [None] * len(self.cache)

    @property
    def nbytes(self) -> int:
        arrays: list[Any] = self.cache
        return sum(int(a.nbytes) for a in arrays if a is not None)


def steps_kept() -> bool:
    """Whether a Gated DeltaNet forward keeps its state after each row (:func:`_stepwise`):
    off Metal, where mlx-lm runs the recurrence step by step; on Metal its kernel gives
    only the last state, and going back recomputes over the rows kept."""
    return not (mx.default_device() == mx.gpu and mx.metal.is_available())


def leaves(cache: Sequence[Any]) -> Iterator[Any]:
    """Every layer's cache, those inside a ``CacheList`` included."""
    for c in cache:
        if isinstance(c, CacheList):
            yield from leaves(c.caches)
        else:
            yield c


def _note(
    rows: int,
    at: Callable[[int], Any],
    made: Any = None,
    before: Any = ...,
    again: Callable[[int], Any] | None = None,
) -> None:
    cache = _active()
    if cache is not None:
        deep = rows > cache.depth  # too many rows to keep the means to go back into
        cache.noted(_Note(rows, None if deep else at, made, None if deep else again), before)


@dataclass(frozen=True)
class Recurrence:
    """How a recurrence mlx-lm's models call takes its rows and its state."""

    timed: dict[str, int]  # the arguments along the rows, and their row axis; the first first
    state: str = "state"  # the argument holding the state before


def _recurrence(fn: Callable[..., Any], spec: Recurrence) -> Callable[..., Any]:
    """``fn`` (returning ``(output, state)``), noting how to get its state after j rows.

    Where the recurrence ran step by step (:func:`_stepwise`), its
    states after each row are kept while its forward is the newest: going
    back into it costs nothing. Otherwise, and once a newer forward runs, the
    state is recomputed over the rows kept; arguments are bound by name only
    then, so a forward pays a lookup per layer, not a binding.
    """
    signature = inspect.signature(fn)
    state_at = list(signature.parameters).index(spec.state)
    (first_name, rows_axis), *_ = spec.timed.items()

    def recorded(*args: Any, **kwargs: Any) -> Any:
        _local.steps = None
        out = fn(*args, **kwargs)
        steps, _local.steps = _local.steps, None
        if _active() is None:
            return out
        first = args[0] if args else kwargs[first_name]
        before = args[state_at] if len(args) > state_at else kwargs.get(spec.state)

        def again(j: int) -> Any:
            cut = dict(signature.bind(*args, **kwargs).arguments)
            for name, axis in spec.timed.items():
                if cut.get(name) is not None:
                    cut[name] = cut[name][(slice(None),) * axis + (slice(0, j),)]
            return fn(**cut)[1]

        rows = first.shape[rows_axis]
        if steps is not None and len(steps) == rows:
            _note(rows, lambda j: steps[j - 1], made=out[1], before=before, again=again)
        else:
            _note(rows, again, made=out[1], before=before)
        return out

    recorded.__wrapped__ = fn  # type: ignore[attr-defined]
    return recorded


def _stepwise(step: Callable[..., Any]) -> Callable[..., Any]:
    """mlx-lm's ``gated_delta_ops`` (the recurrence off Metal), its state after each row kept.

    On CUDA one kernel runs the rows (:mod:`app.engine.delta_kernel`);
    elsewhere the same steps in the same order as mlx-lm's loop, so its output
    is the same to the bit. A forward of at most :data:`ROWS_KEPT` rows hands
    the states it makes anyway to :func:`_recurrence` instead of letting them go.
    """

    def gated_delta_ops(
        q: mx.array,
        k: mx.array,
        v: mx.array,
        g: mx.array,
        beta: mx.array,
        state: mx.array | None = None,
        mask: mx.array | None = None,
    ) -> tuple[mx.array, mx.array]:
        b, rows, hk, dk = q.shape
        hv, dv = v.shape[-2:]
        if state is None:
            state = mx.zeros((b, hv, dv, dk), dtype=mx.float32)
        keep = _active() is not None and rows <= ROWS_KEPT
        if delta_kernel.available() and delta_kernel.fits(q, v, g, mask):
            y, states = delta_kernel.gated_delta_rows(q, k, v, g, beta, state, keep)
            if keep:
                _local.steps = states
            return y, states[-1]
        if (repeat := hv // hk) > 1:
            q, k = mx.repeat(q, repeat, -2), mx.repeat(k, repeat, -2)
        ys, states = [], []
        for t in range(rows):
            m = None if mask is None else mask[:, t]
            y, state = step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state, m)
            ys.append(y)
            states.append(state)
        if keep:
            _local.steps = states
        return mx.stack(ys, axis=1), state

    gated_delta_ops.__wrapped__ = step  # type: ignore[attr-defined]
    return gated_delta_ops


_ROWS = 1  # the row axis of (batch, rows, ...) arguments
# The recurrences mlx-lm's hybrid models call, by name; Ling's lightning attention
# (``recurrent_gla``) takes its heads before its rows.
RECURRENCES = {
    "gated_delta_update": Recurrence(dict.fromkeys(("q", "k", "v", "a", "b", "mask"), _ROWS)),
    "ssm_update": Recurrence(dict.fromkeys(("hidden_states", "B", "C", "dt", "mask"), _ROWS)),
    "recurrent_gla": Recurrence({"q": 2, "k": 2, "v": 2, "mask": _ROWS}, state="h"),
    "rnn_scan": Recurrence({"x": _ROWS, "a": _ROWS}, state="h0"),  # RecurrentGemma's RG-LRU
}
# Methods of a model's modules that run a recurrence: RWKV-7's time mixing.
METHODS = {"_wkv7": Recurrence(dict.fromkeys(("r", "w", "k", "v", "a", "b"), _ROWS))}


class _NotedConv1d(nn.Conv1d):
    """A model's ``Conv1d``: notes its input, of which each state is a slice."""

    def __call__(self, x: mx.array) -> mx.array:
        width = self.weight.shape[1] - 1
        rows = x.shape[1] - width
        if rows > 0:
            _note(rows, lambda j: x[:, j : j + width])
        out: mx.array = super().__call__(x)  # type: ignore[no-untyped-call]
        return out


def _shifted(conv: Callable[..., Any]) -> Callable[..., Any]:
    """Baichuan-M1's two-tap convolution of keys or values, ``(batch, heads, rows, dim)``:
    its state after j rows is the j-th row it read."""

    def recorded(u: mx.array, weights: mx.array, state: mx.array | None = None) -> Any:
        _note(u.shape[2], lambda j: u[:, :, j - 1 : j])
        return conv(u, weights, state)

    recorded.__wrapped__ = conv  # type: ignore[attr-defined]
    return recorded


def _token_shift(forward: Callable[..., Any], shift: Any, x: mx.array, state: Any = None) -> Any:
    """RWKV-7's token shift: its state after j rows is the j-th row it read."""
    _note(x.shape[1], lambda j: x[:, j - 1 : j])
    return forward(shift, x, state)


def _temporal_conv(forward: Callable[..., Any], conv: Any, x: mx.array, cache: Any = None) -> Any:
    """RecurrentGemma's convolution, handing back its last inputs as its state: after j
    rows, the inputs before row j (zeros before the first)."""
    y, tail = forward(conv, x, cache)
    width = tail.shape[1]
    before = cache if cache is not None else mx.zeros((x.shape[0], width, x.shape[2]), x.dtype)
    _note(x.shape[1], lambda j: mx.concatenate([before, x[:, :j]], axis=1)[:, -width:])
    return y, tail


def _ngram_context(
    forward: Callable[..., Any], embedding: Any, ids: mx.array, cache: Any = None
) -> Any:
    """LongCat-Flash's n-gram embedding: its state is the last n - 1 tokens read."""
    if cache is not None:
        before, tokens, keep = cache[0], ids.astype(mx.int64), embedding.n - 1

        def at(j: int) -> mx.array:
            seen = tokens[:, :j] if before is None else mx.concatenate([before, tokens[:, :j]], 1)
            return seen[:, max(0, seen.shape[1] - keep) :]

        _note(ids.shape[1], at)
    return forward(embedding, ids, cache)


# Modules of mlx-lm's models whose state is the inputs they read last, by class.
_LAST_INPUTS = {
    "mlx_lm.models.rwkv7.TokenShift": _token_shift,
    "mlx_lm.models.recurrent_gemma.Conv1d": _temporal_conv,
    "mlx_lm.models.longcat_flash_ngram.NgramEmbedding": _ngram_context,
}
_NOTING: dict[type, type] = {}


def _stepped(step: Callable[..., Any]) -> Callable[..., Any]:
    """A Mamba layer's ``ssm_step``, noted as a recurrence.

    Jamba's runs a forward's rows at once and is noted here. Mamba's own
    (``mlx_lm.models.mamba``) runs a token a call; :func:`_sequenced` collects
    a forward's calls and notes them as one.
    """

    def recorded(x: mx.array, A: mx.array, state: mx.array | None = None) -> Any:  # noqa: N803
        y, new = step(x, A, state)
        if x.ndim == 3:  # (batch, rows, channels)
            _note(x.shape[1], lambda j: step(x[:, :j], A, state)[1], made=new, before=state)
        elif (calls := getattr(_local, "calls", None)) is not None:
            calls.append((x, A, state, new))
        return y, new

    recorded.__wrapped__ = step  # type: ignore[attr-defined]
    return recorded


def _sequenced(forward: Callable[..., Any], step: Callable[..., Any]) -> Callable[..., Any]:
    """Mamba's ``_process_sequence``: its token-at-a-time ``step`` calls noted as one
    recurrence, each row's state kept for a round's rows (:data:`ROWS_KEPT`) and
    recomputed from the inputs beyond."""

    def recorded(*args: Any, **kwargs: Any) -> Any:
        outer, _local.calls = getattr(_local, "calls", None), []
        try:
            out = forward(*args, **kwargs)
            calls = _local.calls
        finally:
            _local.calls = outer
        if not calls:
            return out
        xs = [c[0] for c in calls]
        A, before = calls[0][1], calls[0][2]  # noqa: N806

        def again(j: int) -> Any:
            state = before
            for x in xs[:j]:
                state = step(x, A, state)[1]
            return state

        made = calls[-1][3]
        if len(calls) <= ROWS_KEPT:
            states = [c[3] for c in calls]
            _note(len(calls), lambda j: states[j - 1], made=made, before=before, again=again)
        else:
            _note(len(calls), again, made=made, before=before)
        return out

    recorded.__wrapped__ = forward  # type: ignore[attr-defined]
    return recorded


def wrapped(cls: type, made: dict[type, type], around: Callable[..., Any]) -> type:
    """``cls`` as a subclass of its name and module whose forward is ``around(forward,
    self, *args, **kwargs)``: made once per class and kept in ``made``; a class made
    there already is returned as it is (a model wrapped twice runs ``around`` once)."""
    if cls in made.values():
        return cls
    if cls not in made:

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
            return around(cls.__call__, self, *args, **kwargs)

        namespace = {"__call__": __call__, "__module__": cls.__module__}
        made[cls] = type(cls.__name__, (cls,), namespace)
    return made[cls]


_FORGETTING: dict[type, type] = {}


def _forgetting(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A forward starting and ending with no cache of ours active.

    A cache is made active as a layer reads it; a forward over caches of
    another kind (mlx-lm's own loop, compared by ``bench``) reads none of
    ours, and would otherwise note its states into the cache read last.
    """
    _local.active = None
    try:
        return forward(*args, **kwargs)
    finally:
        _local.active = None


def install(model: nn.Module) -> None:
    """Notes ``model``'s recurrent layers' states: its convolutions and its modules' recurrences."""
    from mlx_lm.models import gated_delta

    model.__class__ = wrapped(type(model), _FORGETTING, _forgetting)

    ops = gated_delta.gated_delta_ops
    if not hasattr(ops, "__wrapped__"):
        gated_delta.gated_delta_ops = _stepwise(gated_delta._gated_delta_step_ops)
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if not name.startswith("mlx_lm.models."):
            continue
        for fn, spec in RECURRENCES.items():
            current = getattr(module, fn, None)
            if callable(current) and not hasattr(current, "__wrapped__"):
                setattr(module, fn, _recurrence(current, spec))
    for _, child in model.named_modules():
        cls = type(child)
        if cls is nn.Conv1d:
            child.__class__ = _NotedConv1d
        elif around := _LAST_INPUTS.get(f"{cls.__module__}.{cls.__name__}"):
            child.__class__ = wrapped(cls, _NOTING, around)
        if callable(getattr(child, "_decode_core", None)):
            # Kimi K3's one-token step, which it compiles on Metal: traced once, its
            # recurrence would run unseen after. Run as it is, its states are noted.
            child._step = child._decode_core
        for method, spec in METHODS.items():
            run = getattr(child, method, None)
            if callable(run) and not hasattr(run, "__wrapped__"):
                setattr(child, method, _recurrence(run, spec))
        taps = getattr(child, "_custom_convolution", None)
        if callable(taps) and not hasattr(taps, "__wrapped__"):
            child._custom_convolution = _shifted(taps)
        step = getattr(child, "ssm_step", None)
        if callable(step) and not hasattr(step, "__wrapped__"):
            child.ssm_step = _stepped(step)
            sequence = getattr(child, "_process_sequence", None)
            if callable(sequence):
                child._process_sequence = _sequenced(sequence, step)


# mlx-lm's model modules whose recurrent states are all noted, each read by
# tests/engine/test_hybrids.py: their caches go back exactly.
REWOUND = frozenset(
    {
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_next",
        "kimi_linear",
        "nemotron_h",
        "granitemoehybrid",
        "falcon_h1",
        "jamba",
        "lfm2",
        "lfm2_moe",
        "mamba2",
        "olmo_hybrid",
        "mamba",
        "bailing_moe_v3",
        "plamo2",
        "baichuan_m1",
        "bailing_moe_linear",
        "bailing_hybrid",
        "recurrent_gemma",
        "rwkv7",
        "kimi_k3",
        "longcat_flash_ngram",
    }
)


def refusal(model: nn.Module, cache: Sequence[Any]) -> str | None:
    """Why ``model``'s recurrent states cannot go back, in one line naming its layers; or None."""
    if not any(isinstance(c, RecurrentCache) for c in leaves(cache)):
        return None
    module = type(model).__module__.rsplit(".", 1)[-1]
    if module in REWOUND:
        return None
    # A family mlx-lm adds later: its layers' calls are not known to be noted.
    return f"its recurrent layers ({module}) keep a state that cannot be given back"
