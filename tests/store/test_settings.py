from __future__ import annotations

from pathlib import Path

import pytest

from app.store import Settings, SettingsFile, write_atomic


def test_round_trip(tmp_path: Path) -> None:
    f = SettingsFile(tmp_path / "settings.json")
    assert f.load() == Settings()
    saved = Settings(
        target="/m/t",
        draft="/m/d",
        num_draft=6,
        auto_draft=True,
        prompt_lookup=True,
        temperature=0.7,
    )
    f.save(saved)
    assert SettingsFile(tmp_path / "settings.json").load() == saved


@pytest.mark.parametrize("content", ["{", "[]", '{"num_draft": "x", "unknown": 1}', ""])
def test_unreadable_file_gives_defaults(tmp_path: Path, content: str) -> None:
    path = tmp_path / "settings.json"
    path.write_text(content)
    assert SettingsFile(path).load() == Settings()


def test_values_of_the_wrong_type_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"num_draft": "x", "temperature": 1, "target": 5, "draft": "/d"}')
    assert SettingsFile(path).load() == Settings(draft="/d", temperature=1)


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    write_atomic(path, b"one")
    write_atomic(path, b"two")
    assert path.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.json"
    write_atomic(path, b"old")

    def boom(*_args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, b"new")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
