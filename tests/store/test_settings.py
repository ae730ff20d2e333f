from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.engine.types import DraftSetting
from app.store import Settings, SettingsFile, write_atomic


def test_round_trip(tmp_path: Path) -> None:
    f = SettingsFile(tmp_path / "settings.json")
    assert f.load() == Settings()
    saved = Settings(
        target="/m/t",
        draft="/m/d",
        drafting=DraftSetting(6, auto=False),  # not the default, so the file must keep it
        prompt_lookup=True,
        temperature=0.7,
    )
    f.save(saved)
    assert SettingsFile(tmp_path / "settings.json").load() == saved


def test_a_new_install_lets_auto_pick_k() -> None:
    s = Settings()
    assert s.drafting.auto is True
    assert s.drafting.k == 4  # the slider's fixed k, for when Auto is turned off


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
    assert back.best_k == {} and back.drafting == DraftSetting(3)  # an older file's k


@pytest.mark.parametrize(
    ("entry", "drafting"),
    [({"num_draft": 7, "auto_draft": False}, DraftSetting(7, auto=False)),
     ({"auto_draft": False}, DraftSetting(auto=False)),
     ({"drafting": {"k": 2, "auto": True, "limit": 8}}, DraftSetting(2, limit=8)),
     ({"drafting": {"k": 17}}, DraftSetting()),
     ({"drafting": {"k": 2, "speed": 1}}, DraftSetting()),
     ({"drafting": [2]}, DraftSetting())],
)  # fmt: skip
def test_the_draft_setting_reads_from_this_file_or_an_older_ones(
    tmp_path: Path, entry: dict[str, object], drafting: DraftSetting
) -> None:
    (tmp_path / "s.json").write_text(json.dumps({**entry, "temperature": 0.5}))
    back = SettingsFile(tmp_path / "s.json").load()
    assert back.drafting == drafting and back.temperature == 0.5  # a bad one drops alone
