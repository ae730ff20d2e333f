from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TinyModels


def _tandem(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_generate_json(tiny: TinyModels) -> None:
    r = _tandem(
        "generate",
        "--model",
        str(tiny.target),
        "--draft",
        str(tiny.copy),
        "--num-draft",
        "3",
        "--max-tokens",
        "12",
        "--json",
        "Hello",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("text", "token_ids", "drafted", "accepted", "acceptance", "generation_tps"):
        assert key in out
    assert out["finish_reason"] in {"stop", "length"}
    assert out["accepted"] == out["drafted"] > 0
    assert len(out["token_ids"]) <= 12
    assert len(out["origins"]) == len(out["token_ids"])


def test_generate_streams_text(tiny: TinyModels, tiny_pair) -> None:
    r = _tandem("generate", "--model", str(tiny.target), "--max-tokens", "8", "Hi")
    assert r.returncode == 0, r.stderr
    assert "tok/s" in r.stderr
    assert r.stdout.endswith("\n")


def test_greedy_cli_matches_with_and_without_draft(tiny: TinyModels) -> None:
    common = ("--max-tokens", "20", "--json", "Say something")
    plain = json.loads(_tandem("generate", "--model", str(tiny.target), *common).stdout)
    spec = json.loads(
        _tandem("generate", "--model", str(tiny.target), "--draft", str(tiny.draft), *common).stdout
    )
    assert spec["token_ids"] == plain["token_ids"]


@pytest.mark.parametrize(
    ("folder", "code", "reason"),
    [("missing", 1, "no such folder"), ("empty", 1, "no config.json")],
)
def test_bad_folder_exits_with_one_line(tmp_path: Path, folder, code, reason) -> None:
    (tmp_path / "empty").mkdir()
    r = _tandem("generate", "--model", str(tmp_path / folder), "Hi")
    assert r.returncode == code
    assert reason in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_incompatible_pair_exits_2(tiny: TinyModels) -> None:
    r = _tandem("generate", "--model", str(tiny.target), "--draft", str(tiny.foreign), "Hi")
    assert r.returncode == 2
    assert "cannot draft for" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_version() -> None:
    r = _tandem("--version")
    assert r.returncode == 0
    assert r.stdout.startswith("tandem ")
