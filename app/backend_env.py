"""Process-wide settings of MLX's backends, made before the app imports MLX.

MLX's CUDA backend records kernels into CUDA graphs of at most
``MLX_MAX_OPS_PER_BUFFER`` nodes (20 unless set), each cached by its topology
among ``MLX_CUDA_GRAPH_CACHE_SIZE`` graphs (400). A round of a 4-bit 70B is
thousands of nodes, so it launched hundreds of small graphs. On the H200 (run
18 in docs/benchmarks-history.md) graphs of 100 nodes, cached among 4000, took 8
batched streams' rounds from 0.316 to 0.279 s and one request's speculative
decoding from 55 to 64 tok/s; a larger cache alone changed nothing. Metal
reads the same variable with per-chip defaults of its own, unmeasured here,
so macOS keeps MLX's; later MLX releases choose CUDA values per GPU
architecture, so only the measured series is changed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from importlib import metadata

# What run 18 measured, on this MLX series; a value the user has set is kept.
MEASURED_SERIES = "0.32."
CUDA_GRAPHS: Mapping[str, str] = {
    "MLX_MAX_OPS_PER_BUFFER": "100",
    "MLX_CUDA_GRAPH_CACHE_SIZE": "4000",
}


def apply_defaults(
    environ: MutableMapping[str, str] | None = None,
    platform: str = sys.platform,
    mlx_version: str | None = None,
) -> dict[str, str]:
    """Sets the CUDA graph sizes the user has not set, off macOS, on the measured MLX series.

    MLX reads them once, as it starts its GPU or at its first GPU work, so
    ``app`` runs this before any of its modules imports MLX. On the CPU
    backend they made no difference (a tiny pair's forwards, within noise).

    Args:
        environ: The environment to change (the process's by default).
        platform: ``sys.platform`` (macOS runs Metal, not CUDA).
        mlx_version: MLX's version (the installed one's by default).

    Returns:
        The variables it set.
    """
    env = os.environ if environ is None else environ
    if platform == "darwin":
        return {}
    version = mlx_version if mlx_version is not None else _installed_mlx()
    if not version.startswith(MEASURED_SERIES):
        return {}
    added = {name: value for name, value in CUDA_GRAPHS.items() if name not in env}
    env.update(added)
    return added


def _installed_mlx() -> str:
    try:
        return metadata.version("mlx")
    except metadata.PackageNotFoundError:
        return ""


# Recorded, never set: whether MLX's CUDA backend uses graphs at all (on unless "0").
RECORDED = ("MLX_USE_CUDA_GRAPHS",)


def settings(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The graph settings MLX runs with, for benchmark records."""
    env = os.environ if environ is None else environ
    return {name: env.get(name) for name in (*CUDA_GRAPHS, *RECORDED)}


__all__ = ["CUDA_GRAPHS", "MEASURED_SERIES", "RECORDED", "apply_defaults", "settings"]
