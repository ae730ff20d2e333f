"""What every step of an import shares: progress, cancel, metadata values, planned tensors."""

from __future__ import annotations

import threading
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


def _f32(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that reads back the same."""
    return float(str(np.float32(value)))
