"""``tools/batch_trace.py`` wraps the batch's methods as they are now (the device runs it blind);
``tools/round_fit.py`` reads what it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / name), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
        timeout=120,
        check=False,
    )


def test_trace_logs_every_batched_round(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    args = "--synthetic tiny:tiny --concurrent 2 --miss 0.1 --ks auto --temps 0 --max-tokens 8"
    r = _tool("batch_trace.py", str(trace), *args.split())
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    shared = [row for row in rows if row["b"] == 2]
    assert shared, rows
    assert all(row["timed"] is not None and row["stacked"] is not None for row in shared)
    assert all(len(row["ks"]) == len(row["accepted"]) == 2 for row in shared)


def test_round_fit_fits_each_count_with_untimed_rounds_of_several_drafts(tmp_path: Path) -> None:
    trace, bench = tmp_path / "trace.jsonl", tmp_path / "bench.json"
    args = "--synthetic tiny:tiny --concurrent 2,3 --miss 0.1 --ks 2,6 --temps 0 --max-tokens 40"
    r = _tool("batch_trace.py", str(trace), *args.split(), "--json", str(bench))
    assert r.returncode == 0, r.stderr
    r = _tool("round_fit.py", str(trace), str(bench))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:2] == ["b", "rounds"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == {"2", "3"}
    # Both fixed k ran untimed (a round near the end of its budget drafts less).
    assert all({"2", "6"} <= set(row[2].split(",")) for row in rows.values())
    assert all(row[3] != "-" and row[4] != "-" for row in rows.values())  # so a line was fitted
