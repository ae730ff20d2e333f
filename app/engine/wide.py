"""Wide forwards through weights dequantized on the fly.

MLX's 4-bit matmul kernel on CUDA costs time in proportion to its rows past a
few dozen (a 70B layer's projections: 1.71 ms at 128 rows, 3.31 ms at 256),
while dequantizing the weights and running an ordinary matmul costs nearly
the same at any width (1.99 and 2.17 ms; run 18 in docs/benchmarks-history.md). So a
forward of many rows, a long prompt's chunk or the batch reading several
prompts in one, runs faster through weights dequantized one projection at a
time, never the whole model at once.

Where that starts differs per backend and per model (on this CPU it is a few
rows, on CUDA past a hundred, on Metal unmeasured), so :func:`install` times
one layer's projections both ways on the machine at hand (:func:`measure`) and
sets the width on every quantized projection of the model. The arithmetic per
row changes only in rounding: the dequantized weights are the quantized ones.
"""

from __future__ import annotations

import functools
import re
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn

Mode = Literal["auto", "off"] | int
WIDTHS = (64, 128, 256, 512)  # rows tried, up to the widest chunk the engines read
MIN_GAIN = 0.10  # dequantizing must save this share of the kernel's time
REPEATS = 3
_queued = [0]  # bytes dequantized since the last evaluation (engine thread only)
SLOW = 0.25  # seconds: after a timed run this slow, no more are timed
_state: dict[str, Mode] = {"mode": "auto"}
_MARK = "_tandem_wide"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _valid(mode: object) -> bool:
    return mode in ("auto", "off") or (isinstance(mode, int) and mode > 0)


def check_mode(mode: object) -> None:
    """Raises ValueError unless ``mode`` is ``auto``, ``off`` or a positive row count."""
    if not _valid(mode):
        raise ValueError(f"wide mode must be auto, off or a positive row count, not {mode!r}")


def set_mode(mode: Mode) -> None:
    """``auto`` measures each model, ``off`` never dequantizes, a number fixes the width."""
    check_mode(mode)
    _state["mode"] = mode


def mode() -> Mode:
    """The mode set last (``auto`` until one is)."""
    return _state["mode"]


def parse_mode(text: str) -> Mode:
    """``--wide``'s value: ``auto``, ``off`` or a row count.

    Raises:
        ValueError: Neither.
    """
    mode = int(text) if text.isdigit() else text
    if not _valid(mode):
        raise ValueError(f"--wide takes auto, off or a positive row count, not {text!r}")
    return mode  # type: ignore[return-value]


def rows(x: mx.array) -> int:
    """The rows a projection of ``x`` multiplies: every axis but the last."""
    return x.size // x.shape[-1] if x.ndim else 0


def matmul(x: mx.array, proj: Any, wide: int | None) -> mx.array:
    """``x`` times quantized ``proj``'s weights (transposed), dequantized from ``wide`` rows on.

    ``proj`` has an nn.QuantizedLinear's arrays and settings (``weight``,
    ``scales``, optional ``biases``; ``group_size``, ``bits``, ``mode``).
    """
    biases = proj.get("biases")
    if wide is not None and rows(x) >= wide:
        w = mx.dequantize(
            proj["weight"],
            proj["scales"],
            biases,
            group_size=proj.group_size,
            bits=proj.bits,
            mode=proj.mode,
        )
        y = x @ w.T
        _bound_queue(y, w.nbytes, proj.queue)
        return y
    return mx.quantized_matmul(
        x,
        proj["weight"],
        scales=proj["scales"],
        biases=biases,
        transpose=True,
        group_size=proj.group_size,
        bits=proj.bits,
        mode=proj.mode,
    )


def _bound_queue(y: mx.array, nbytes: int, limit: int) -> None:
    """Evaluates ``y`` once ``limit`` bytes of dequantized weights wait unevaluated.

    Left lazy, a 70B's 512-row read on the H200 queued about eight layers'
    weights (13 GiB more at its peak, 219 ms); evaluated after every
    projection it peaked no higher than the 4-bit kernel's read but took
    312 ms, one synchronisation per projection; with up to 2 GiB (a little
    over a layer) queued, 259 ms and 41.5 GiB against the kernel's 578 ms and
    44.3 GiB (run 25 in docs/benchmarks-history.md).
    """
    _queued[0] += nbytes
    if _queued[0] >= limit:
        mx.eval(y)
        _queued[0] = 0


def _projections(model: nn.Module) -> Iterator[tuple[str, Any]]:
    from app.engine.fuse import FusedProjection

    for name, module in model.named_modules():
        if isinstance(module, FusedProjection) and module.quantized:
            yield name, module


def _first_layer(model: nn.Module) -> list[Any]:
    """The quantized projections of the lowest-numbered layer that has any."""
    by_layer: dict[int, list[Any]] = {}
    for name, proj in _projections(model):
        if found := _LAYER.search(name):
            by_layer.setdefault(int(found.group(1)), []).append(proj)
    return by_layer[min(by_layer)] if by_layer else []


def _seconds(run: Callable[[], list[mx.array]]) -> float:
    """The median of a few timed runs, after one that builds the shape's kernels.

    The timing stops after a run slower than :data:`SLOW`: on a backend that
    slow (this CPU: seconds a layer) more runs would only keep the user
    waiting. The build's run is never timed, as on CUDA it can take seconds.
    """
    mx.eval(run())
    laps: list[float] = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        mx.eval(run())
        laps.append(time.perf_counter() - start)
        if laps[-1] > SLOW:
            break
    return statistics.median(laps)


def measure(model: nn.Module, widths: tuple[int, ...] = WIDTHS) -> int | None:
    """Times one layer's quantized projections both ways; the width to dequantize from.

    Widths are tried narrowest first and the timing stops at the first where
    dequantizing saves :data:`MIN_GAIN` of the kernel's time: the kernel's
    time grows faster with the rows from there on, and a backend where it is
    slow at any width is not made to run it wide.

    Returns:
        ``None`` for a model without quantized projections or where the kernel
        keeps up at every width tried.
    """
    projs = _first_layer(model)
    for width in widths if projs else ():
        xs = [mx.zeros((1, width, _inputs(p)), p["scales"].dtype) for p in projs]
        mx.eval(xs)
        kernel = _seconds(functools.partial(_layer, xs, projs, None))
        dequantized = _seconds(functools.partial(_layer, xs, projs, 1))
        if dequantized <= kernel * (1 - MIN_GAIN):
            return width
    return None


def _layer(xs: list[mx.array], projs: list[Any], wide: int | None) -> list[mx.array]:
    return [matmul(x, p, wide) for x, p in zip(xs, projs, strict=True)]


def _inputs(proj: Any) -> int:
    return int(proj["scales"].shape[-1]) * int(proj.group_size)


def _dequantized_bytes(proj: Any) -> int:
    itemsize: int = proj["scales"].itemsize
    return int(proj["scales"].shape[0]) * _inputs(proj) * itemsize


def install(model: nn.Module) -> int | None:
    """Sets the width ``model``'s quantized projections dequantize from, by the mode.

    Measured once per model and mode; idempotent. At most one layer's
    dequantized weights wait unevaluated (:func:`_bound_queue`), about 4/L of
    an L-layer model's 4-bit weights.

    Returns:
        That width; ``None`` where they never dequantize.
    """
    mode = _state["mode"]
    done: tuple[Mode, int | None] | None = getattr(model, _MARK, None)
    if done is not None and done[0] == mode:
        return done[1]
    width = None if mode == "off" else measure(model) if mode == "auto" else int(mode)
    layer = sum(_dequantized_bytes(p) for p in _first_layer(model))
    for _, proj in _projections(model):
        proj.wide, proj.queue = width, layer
    object.__setattr__(model, _MARK, (mode, width))
    return width
