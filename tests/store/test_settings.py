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
        auto_draft=False,  # not the default, so the file must keep it
        prompt_lookup=True,
        temperature=0.7,
    )
    f.save(saved)
    assert SettingsFile(tmp_path / "settings.json").load() == saved


def test_a_new_install_lets_auto_pick_k() -> None:
    s = Settings()
    assert s.auto_draft is True
    assert s.num_draft == 4  # the slider's fixed k, for when Auto is turned off


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


def test_best_k_per_pair_round_trips_and_bad_values_are_dropped(tmp_path: Path) -> None:
    import json

    from app.store import pair_key

    f = SettingsFile(tmp_path / "s.json")
    key = pair_key("/m/t", "/m/d")
    f.save(Settings().updated(best_k={key: 5}, colour_tokens=False))
    back = f.load()
    assert back.best_k == {key: 5} and not back.colour_tokens
    assert pair_key("/m/t", None) == "/m/t|"
    (tmp_path / "s.json").write_text(json.dumps({"best_k": {key: "five"}, "num_draft": 3}))
    back = f.load()
    assert back.best_k == {} and back.num_draft == 3
