"""What every step of an import shares: progress, cancel, metadata values, planned tensors."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.errors import ModelError

_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}
_SAFETENSORS_CODES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


class ImportCancelled(Exception):  # noqa: N818 - a cancel, not an error
    """The import was cancelled; nothing was left behind."""


@dataclass(frozen=True, slots=True)
class ImportProgress:
    """How far an import has come.

    Attributes:
        stage: ``"reading"``, ``"tokenizer"``, ``"tensors"``, ``"quantizing"`` or ``"writing"``.
        done: Steps of the stage finished.
        total: Steps of the stage.
    """

    stage: str
    done: int
    total: int


@dataclass(frozen=True, slots=True)
class _Planned:
    """One output tensor: where it comes from and what it becomes."""

    source: Any  # gguf.ReaderTensor, or None for tensors of the quantized model
    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype code
    nbytes: int


@dataclass(frozen=True, slots=True)
class _Joined:
    """A planned tensor's source: several of the file's tensors, their rows one after another."""

    parts: tuple[Any, ...]


def _join(plan: Sequence[_Planned], first: str, second: str, into: str) -> list[_Planned]:
    """Each layer's two tensors named ``...first`` and ``...second`` (llama.cpp's halves of
    one checkpoint tensor) planned as the one ``...into``, read from both, ``first``'s rows
    first. A part without its match is left for the model's check to refuse."""
    seconds = {p.name.removesuffix(second): p for p in plan if p.name.endswith(second)}
    joined: list[_Planned] = []
    for p in plan:
        layer = p.name.removesuffix(first)
        other = seconds.get(layer) if p.name.endswith(first) else None
        if other is not None and other.shape[1:] == p.shape[1:]:
            del seconds[layer]
            shape = (p.shape[0] + other.shape[0], *p.shape[1:])
            source = _Joined((p.source, other.source))
            joined.append(_Planned(source, layer + into, shape, p.dtype, p.nbytes + other.nbytes))
        elif not p.name.endswith(second):
            joined.append(p)
    return joined + list(seconds.values())


class _Metadata:
    """The GGUF key/value metadata, read on demand."""

    def __init__(self, reader: Any, label: str) -> None:
        self._fields = reader.fields
        self._label = label

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except (UnicodeDecodeError, ValueError, IndexError) as exc:
            raise ModelError(f"{self._label}: metadata {key} is unreadable") from exc

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelError(f"{self._label}: metadata {key} is missing")
        return value


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise ImportCancelled("import cancelled")


def _int(value: Any) -> int:
    if isinstance(value, list):
        # Per-layer values (some architectures vary them); these models keep them equal.
        if not value or any(v != value[0] for v in value):
            raise ValueError("per-layer values differ")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ValueError(f"expected an integer, got {value!r}")
    return int(value)


def _heads_kv(meta: _Metadata, prefix: str, heads: int) -> tuple[int, list[int] | None]:
    """The attention layers' key-value heads, and each layer's where the file lists them
    a layer (hybrids: 0 for a layer of another kind)."""
    kv = meta.get(prefix + "attention.head_count_kv", heads)
    if not isinstance(kv, list):
        return _int(kv), None
    per_layer = [_int(n) for n in kv]
    attention = {n for n in per_layer if n}
    if len(attention) != 1:
        raise ValueError("the attention layers' key-value heads differ, or there are none")
    return attention.pop(), per_layer


def _granite_multipliers(meta: _Metadata, prefix: str) -> dict[str, Any]:
    """Granite's multipliers, which GraniteModel writes as scales (Granite 3 and 4 alike)."""
    return {
        "attention_multiplier": _f32(meta.get(prefix + "attention.scale", 1.0)),
        "embedding_multiplier": _f32(meta.get(prefix + "embedding_scale", 1.0)),
        "residual_multiplier": _f32(meta.get(prefix + "residual_scale", 1.0)),
        "logits_scaling": _f32(meta.get(prefix + "logit_scale", 1.0)),
    }


def _granite_experts(meta: _Metadata, prefix: str, required: bool = False) -> dict[str, Any]:
    """Granite's mixture of experts as its configs name it (Granite 3 and 4 alike): none
    where the file has no experts, unless ``required``."""
    key = prefix + "expert_count"
    experts = _int(meta.require(key) if required else meta.get(key, 0))
    if not experts:
        return {"num_local_experts": 0}
    used = _int(meta.require(prefix + "expert_used_count"))
    return {"num_local_experts": experts, "num_experts_per_tok": used}


def _f32(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that reads back the same."""
    return float(str(np.float32(value)))
