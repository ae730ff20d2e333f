from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.engine.calibrate import CalibrationPoint, CalibrationResult
from app.engine.costs import CostProfile
from app.store.calibrations import CalibrationsFile

RESULT = CalibrationResult(
    points=(
        CalibrationPoint(0, 40.0, None, None, 64, 1.6),
        CalibrationPoint(4, 70.0, 0.8, 4.0, 64, 0.9),
        CalibrationPoint(None, 72.0, 0.8, 5.5, 64, 0.9),
    ),
    best_k=4,
    baseline_tps=40.0,
    prompts=2,
    max_tokens=32,
    pair="t + d",
    profile=CostProfile((0.02, 0.04, None, 0.05), draft_step=0.002, context=512),
    accept=(0.9, 0.8),
    k_max=3,
)


def test_the_last_result_of_each_pair_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "calibrations.json"
    f = CalibrationsFile(path)
    assert f.get("/m/t", "/m/d") is None  # no file yet
    f.put("/m/t", "/m/d", RESULT)
    other = CalibrationResult(RESULT.points[:2], 0, 40.0, 1, 8)
    f.put("/m/t", None, other)
    again = CalibrationsFile(path)
    assert again.get("/m/t", "/m/d") == RESULT  # the profile included
    assert again.get("/m/t", None) == other
    assert again.get("/m/other", "/m/d") is None
    newer = CalibrationResult(RESULT.points, 0, 41.0, 2, 32, profile=RESULT.profile)
    again.put("/m/t", "/m/d", newer)
    assert CalibrationsFile(path).get("/m/t", "/m/d") == newer
    assert CalibrationsFile(path).get("/m/t", None) == other  # other pairs are kept
    assert [p.name for p in tmp_path.iterdir()] == ["calibrations.json"]  # no temp file left


@pytest.mark.parametrize(
    "content",
    ["", "{", "[]", '"text"', '{"version": 2, "results": {}}', '{"version": 1, "results": 3}'],
)
def test_a_broken_file_reads_as_nothing(tmp_path: Path, content: str) -> None:
    path = tmp_path / "calibrations.json"
    path.write_text(content)
    f = CalibrationsFile(path)
    assert f.get("/m/t", "/m/d") is None
    f.put("/m/t", "/m/d", RESULT)  # and is replaced by the next result
    assert f.get("/m/t", "/m/d") == RESULT


@pytest.mark.parametrize(
    "entry",
    [
        "text",
        {"points": []},
        {**RESULT.as_dict(), "points": ["x"]},
        {**RESULT.as_dict(), "points": [{"k": 4, "tps": "fast"}]},
        {**RESULT.as_dict(), "best_k": 9},  # no point of the best k
        {**RESULT.as_dict(), "profile": {"verify": 3}},
    ],
)
def test_an_unreadable_entry_reads_as_nothing(tmp_path: Path, entry: object) -> None:
    path = tmp_path / "calibrations.json"
    good = RESULT.as_dict()
    path.write_text(json.dumps({"version": 1, "results": {"/m/t|/m/d": entry, "/m/t|": good}}))
    f = CalibrationsFile(path)
    assert f.get("/m/t", "/m/d") is None
    assert f.get("/m/t", None) == RESULT
