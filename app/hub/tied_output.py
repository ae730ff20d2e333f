"""Whether a model's output layer is a copy of its input embeddings.

A model trained with tied embeddings (Qwen2.5 0.5B to 3B, Llama 3.2, Gemma) has
one matrix for both; its makers count it once ("Qwen2.5-1.5B: 1.54 B
parameters"). A GGUF file of such a model often stores the output again as
``output.weight``, quantized its own way, so the folder imported from it holds an
``lm_head.weight`` of the embedding's shape. Counting both calls the 1.5B model
1.8 B, the 0.5B one 630 M. A trained head of the same shape (Llama 3.1 8B,
Qwen2.5 7B) points elsewhere and is counted. Only a few rows are read.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

_ROWS = 8  # rows compared, spread over the vocabulary
_SAME = 0.9  # the least mean cosine of a copy: quantization error keeps a copy near 1
_FLOATS: dict[str, np.dtype[Any]] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # the high half of a float32
}


def output_repeats_embedding(files: Sequence[Path], output: str, embedding: str) -> bool:
    """Whether tensor ``output`` holds the rows of ``embedding`` (of the same shape).

    Float rows are compared by direction, so a copy stored at another precision
    counts as one; MLX-quantized (packed ``U32``) rows only when their bits match.
    Any tensor that cannot be read is taken as not a copy.
    """
    try:
        found = {name: _locate(files, name) for name in (output, embedding)}
        a, b = found[output], found[embedding]
        if a is None or b is None or a[1] != b[1] or len(a[1]) != 2 or not a[1][0]:
            return False
        floats = a[2] in _FLOATS and b[2] in _FLOATS
        if not floats and a[2] != b[2]:
            return False
        rows = sorted({round(i * (a[1][0] - 1) / (_ROWS - 1)) for i in range(_ROWS)})
        x, y = _rows(a, rows), _rows(b, rows)
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return False
    if not floats:
        return bool(x.tobytes() == y.tobytes())
    norms = np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1)
    shown = norms > 0  # padding rows past the vocabulary are often zero in both
    if not shown.any():
        return False
    cosine = (x * y).sum(axis=1)[shown] / norms[shown]
    return bool(cosine.mean() >= _SAME)


_Found = tuple[tuple[Path, int], tuple[int, ...], str]  # (file, data start), shape, dtype


def _locate(files: Sequence[Path], name: str) -> _Found | None:
    for file in files:
        with file.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        entry = header.get(name)
        if isinstance(entry, dict):
            start = 8 + length + int(entry["data_offsets"][0])
            return (file, start), tuple(int(d) for d in entry["shape"]), str(entry["dtype"])
    return None


def _rows(found: _Found, rows: list[int]) -> np.ndarray:
    (file, start), shape, dtype = found
    item = _FLOATS.get(dtype, np.dtype("<u4"))
    width = shape[1] * item.itemsize
    out = []
    with file.open("rb") as f:
        for row in rows:
            f.seek(start + row * width)
            data = f.read(width)
            if len(data) != width:
                raise ValueError("truncated")
            out.append(np.frombuffer(data, dtype=item))
    x = np.stack(out)
    if dtype == "BF16":
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32) if dtype in _FLOATS else x
