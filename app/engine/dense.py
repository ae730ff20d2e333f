"""A small quantized draft kept dequantized where its steps run faster so.

A draft's steps are most of a round, and a step of a small model runs its
projections one or a few rows at a time. On MLX's CUDA backend the 4-bit
kernel of so few rows is slower than an ordinary matmul of the dequantized
weights: a 1B draft's step took 3.15 ms at 4 bits and 2.37 ms in bfloat16,
four sequences stacked 4.24 and 3.51 ms (run 26 in docs/benchmarks.md). On
Metal a 4-bit step reads a quarter of the bytes, which may well win there. So
:func:`install` times every quantized projection of the model at one row both
ways on the machine at hand and keeps the weights dequantized where that saves
:data:`MIN_GAIN` of the time, and only while the dequantized weights take at
most :data:`SHARE` of the device's memory beyond the quantized ones.

Only the draft runs this way (:func:`app.engine.speculative.prepare`): its
arithmetic changes only in rounding, and the target verifies what it proposes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

Mode = Literal["auto", "on", "off"]
MODES: tuple[Mode, ...] = ("auto", "on", "off")
MIN_GAIN = 0.10  # dequantized weights must save this share of the projections' time
SHARE = 0.05  # of the device's memory the dequantized weights may take beyond the quantized
REPEATS = 5
_state: dict[str, Mode] = {"mode": "auto"}
_MARK = "_tandem_dense"


@dataclass(frozen=True, slots=True)
class Choice:
    """What :func:`install` found for one model.

    Attributes:
        dense: Whether the model's weights are now kept dequantized.
        extra: Bytes the dequantized weights take beyond the quantized ones.
        quantized: Seconds of all its projections at one row, 4-bit kernel (0 if not timed).
        dequantized: The same through the dequantized weights (0 if not timed).
        reason: Why, in words.
    """

    dense: bool
    extra: int = 0
    quantized: float = 0.0
    dequantized: float = 0.0
    reason: str = ""


def set_mode(mode: str) -> None:
    """``auto`` measures each draft, ``on`` always dequantizes, ``off`` never.

    Raises:
        ValueError: Another word.
    """
    if mode not in MODES:
        raise ValueError(f"dense draft mode must be auto, on or off, not {mode!r}")
    _state["mode"] = mode


def install(model: nn.Module, memory: int | None = None) -> Choice:
    """Keeps ``model``'s quantized weights dequantized where the mode and a timing say so.

    Once per model: what it chose stays, as dequantizing cannot be undone.

    Args:
        model: The draft (its projections fused or not).
        memory: The device's memory in bytes; by default what MLX reports.
            Where unknown, ``auto`` keeps the weights quantized.

    Returns:
        What was chosen and why.
    """
    done: Choice | None = getattr(model, _MARK, None)
    if done is not None:
        return done
    choice = _choose(model, _state["mode"], _memory() if memory is None else memory)
    object.__setattr__(model, _MARK, choice)
    return choice


def _choose(model: nn.Module, mode: Mode, memory: int | None) -> Choice:
    found = _quantized(model)
    if not found:
        return Choice(False, reason="no quantized weights")
    if mode == "off":
        return Choice(False, reason="off")
    extra = sum(_dense_bytes(m) - _bytes(m) for _, m in found)
    if mode == "auto" and (not memory or extra > SHARE * memory):
        return Choice(False, extra, reason="the dequantized weights would not fit")
    weights = {name: _weight(m) for name, m in found}
    mx.eval(list(weights.values()))
    quantized = dequantized = 0.0
    if mode == "auto":
        xs = {name: mx.zeros((1, 1, _inputs(m)), m["scales"].dtype) for name, m in found}
        mx.eval(list(xs.values()))
        quantized = _seconds(lambda: [_quantized_call(m, xs[n]) for n, m in found])
        dequantized = _seconds(lambda: [xs[n] @ weights[n].T for n, _ in found])
        if dequantized > (1 - MIN_GAIN) * quantized:
            return Choice(False, extra, quantized, dequantized, "the 4-bit kernel is as fast")
    _dequantize(model, found, weights)
    why = "on" if mode == "on" else "faster"
    return Choice(True, extra, quantized, dequantized, why)


def _memory() -> int | None:
    try:
        info = mx.device_info()
    except Exception:  # an MLX without it: unknown
        return None
    # Metal's working set first: past it wired GPU memory starts to swap.
    for key in ("max_recommended_working_set_size", "memory_size", "total_memory"):
        value = info.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _quantized(model: nn.Module) -> list[tuple[str, Any]]:
    """Every module holding quantized weights, by its name in the model."""
    from app.engine.fuse import FusedProjection

    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding)
        or (isinstance(m, FusedProjection) and m.quantized)
    ]


def _weight(module: Any) -> mx.array:
    """The ``(outputs, inputs)`` weights of a quantized module, dequantized."""
    return mx.dequantize(
        module["weight"],
        module["scales"],
        module.get("biases"),
        group_size=module.group_size,
        bits=module.bits,
        mode=module.mode,
    )


def _inputs(module: Any) -> int:
    return int(module["scales"].shape[-1]) * int(module.group_size)


def _bytes(module: Any) -> int:
    return sum(module[n].nbytes for n in ("weight", "scales", "biases") if n in module)


def _dense_bytes(module: Any) -> int:
    return int(module["scales"].shape[0]) * _inputs(module) * module["scales"].itemsize


def _quantized_call(module: Any, x: mx.array) -> mx.array:
    return module.as_linear(x) if isinstance(module, nn.QuantizedEmbedding) else module(x)


def _seconds(run: Callable[[], list[mx.array]]) -> float:
    """The median of a few timed runs, after one that builds the kernels."""
    mx.eval(run())
    laps = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        mx.eval(run())
        laps.append(time.perf_counter() - start)
    return statistics.median(laps)


def _dequantize(
    model: nn.Module, found: list[tuple[str, Any]], weights: dict[str, mx.array]
) -> None:
    """Puts the dequantized weights in place of the quantized ones."""
    from app.engine.fuse import FusedProjection

    swaps: list[tuple[str, nn.Module]] = []
    for name, m in found:
        w = weights.pop(name)
        if isinstance(m, FusedProjection):
            m.dequantize(w)  # in place: its parts hold it
        elif isinstance(m, nn.QuantizedEmbedding):
            embedding = nn.Embedding(1, 1)
            embedding.weight = w
            swaps.append((name, embedding))
        else:
            linear = nn.Linear(1, 1, bias="bias" in m)
            linear.weight = w
            if "bias" in m:
                linear.bias = m["bias"]
            swaps.append((name, linear))
    if swaps:
        model.update_modules(tree_unflatten(swaps))
    mx.eval(model.parameters())


__all__ = ["MODES", "Choice", "install", "set_mode"]
