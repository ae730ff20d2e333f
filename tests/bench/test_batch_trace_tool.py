"""``tools/batch_trace.py`` wraps the batch's methods as they are now (the device runs it blind)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_trace_logs_every_batched_round(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    args = "--synthetic tiny:tiny --concurrent 2 --miss 0.1 --ks auto --temps 0 --max-tokens 8"
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "batch_trace.py"), str(trace), *args.split()],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    shared = [row for row in rows if row["b"] == 2]
    assert shared, rows
    assert all(row["timed"] is not None and row["stacked"] is not None for row in shared)
    assert all(len(row["ks"]) == len(row["accepted"]) == 2 for row in shared)
