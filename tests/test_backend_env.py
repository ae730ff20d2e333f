"""The CUDA graph sizes the engine sets before MLX's first GPU work."""

from __future__ import annotations

import os
import subprocess
import sys

from app import backend_env as backend


def test_sets_the_measured_graph_sizes_off_macos() -> None:
    env: dict[str, str] = {}
    added = backend.apply_defaults(env, platform="linux", mlx_version="0.32.4")
    assert env == added == {"MLX_MAX_OPS_PER_BUFFER": "100", "MLX_CUDA_GRAPH_CACHE_SIZE": "4000"}


def test_keeps_what_the_user_set() -> None:
    env = {"MLX_MAX_OPS_PER_BUFFER": "20"}
    added = backend.apply_defaults(env, platform="linux", mlx_version="0.32.4")
    assert env["MLX_MAX_OPS_PER_BUFFER"] == "20"
    assert added == {"MLX_CUDA_GRAPH_CACHE_SIZE": "4000"}


def test_leaves_metal_and_unmeasured_mlx_alone() -> None:
    mac: dict[str, str] = {}
    later: dict[str, str] = {}
    assert backend.apply_defaults(mac, platform="darwin", mlx_version="0.32.4") == {}
    assert backend.apply_defaults(later, platform="linux", mlx_version="0.33.0") == {}
    assert backend.apply_defaults(later, platform="linux", mlx_version="") == {}
    assert mac == later == {}


def test_the_app_sets_them_before_any_of_its_modules_imports_mlx() -> None:
    env = {k: v for k, v in os.environ.items() if k not in backend.CUDA_GRAPHS}
    code = (
        "import os, sys, app; print(os.environ.get('MLX_MAX_OPS_PER_BUFFER'),"
        " 'mlx.core' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    expected = "None" if sys.platform == "darwin" else "100"
    assert out.stdout.split() == [expected, "False"]
    assert backend.settings({"MLX_MAX_OPS_PER_BUFFER": "100"}) == {
        "MLX_MAX_OPS_PER_BUFFER": "100",
        "MLX_CUDA_GRAPH_CACHE_SIZE": None,
        "MLX_USE_CUDA_GRAPHS": None,
    }
    # Graphs turned off is recorded, so a run without them says so in its JSON.
    assert backend.settings({"MLX_USE_CUDA_GRAPHS": "0"})["MLX_USE_CUDA_GRAPHS"] == "0"
