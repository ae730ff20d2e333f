"""Safetensors writing: planned tensors in shards below 2 GB, with their index."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.errors import ModelError
from app.hub.gguf_import.common import _Planned
from app.hub.gguf_import.files import _write_json

# Shards stay below 2 GB so every filesystem and the Hub's tooling accept them.
_SHARD_BYTES = 2_000_000_000


def _shard(plan: Sequence[_Planned]) -> list[list[_Planned]]:
    """Groups tensors into shards of at most ``_SHARD_BYTES`` (a larger tensor gets its own)."""
    shards: list[list[_Planned]] = []
    size = 0
    for p in plan:
        if not shards or (shards[-1] and size + p.nbytes > _SHARD_BYTES):
            shards.append([])
            size = 0
        shards[-1].append(p)
        size += p.nbytes
    return shards


def _write_shards(
    folder: Path,
    shards: Sequence[Sequence[_Planned]],
    produce: Callable[[_Planned], np.ndarray],
    written: Callable[[int, int], None],
) -> None:
    """Streams tensors into safetensors files, one tensor in memory at a time.

    The shapes are known up front, so each file's header is written first and
    every tensor's bytes follow as soon as ``produce`` returns them.
    """
    total = sum(len(s) for s in shards)
    done = 0
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        file_name = (
            "model.safetensors"
            if len(shards) == 1
            else f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        )
        header: dict[str, Any] = {"__metadata__": {"format": "mlx"}}
        offset = 0
        for p in shard:
            header[p.name] = {
                "dtype": p.dtype,
                "shape": list(p.shape),
                "data_offsets": [offset, offset + p.nbytes],
            }
            offset += p.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)  # keeps the data 8-byte aligned
        with (folder / file_name).open("wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for p in shard:
                data = np.ascontiguousarray(produce(p))
                if data.nbytes != p.nbytes:
                    raise ModelError(f"tensor {p.name} has {data.nbytes} bytes, not {p.nbytes}")
                f.write(data.reshape(-1).view(np.uint8).data)
                del data
                weight_map[p.name] = file_name
                done += 1
                written(done, total)
    if len(shards) > 1:
        total_size = sum(p.nbytes for s in shards for p in s)
        index = {
            "metadata": {"total_size": total_size},
            "weight_map": dict(sorted(weight_map.items())),
        }
        _write_json(folder / "model.safetensors.index.json", index)
