"""``tandem bench --trace`` writes what the decoders' observer hook says; ``tools/round_fit.py``
reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
        timeout=120,
        check=False,
    )


def test_trace_logs_every_batched_round(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    args = "--synthetic tiny:tiny --concurrent 2 --miss 0.1 --ks auto --temps 0 --max-tokens 8"
    r = _run("-m", "app", "bench", *args.split(), "--trace", str(trace))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    runs = [row for row in rows if row["event"] == "RoundRun"]
    shared = [row for row in runs if len(row["ks"]) == 2]
    assert shared, rows
    assert all(len(row["accepted"]) == 2 and row["seconds"] > 0 for row in shared)
    assert any(row["event"] == "RoundPlanned" for row in rows)  # two on Auto plan together
    assert any(row["event"] == "PrefillChunk" and row["rows"] > 0 for row in rows)
    # The lone decoder the bench compares with is traced too, as another decoder.
    assert len({row["decoder"] for row in rows}) > 1


def test_round_fit_fits_each_count_with_untimed_rounds_of_several_drafts(tmp_path: Path) -> None:
    trace, bench = tmp_path / "trace.jsonl", tmp_path / "bench.json"
    args = "--synthetic tiny:tiny --concurrent 2,3 --miss 0.1 --ks 2,6 --temps 0 --max-tokens 40"
    r = _run("-m", "app", "bench", *args.split(), "--json", str(bench), "--trace", str(trace))
    assert r.returncode == 0, r.stderr
    r = _run(str(ROOT / "tools" / "round_fit.py"), str(trace), str(bench))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:2] == ["b", "rounds"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == {"2", "3"}
    # Both fixed k ran untimed (a round near the end of its budget drafts less).
    assert all({"2", "6"} <= set(row[2].split(",")) for row in rows.values())
    assert all(row[3] != "-" and row[4] != "-" for row in rows.values())  # so a line was fitted
