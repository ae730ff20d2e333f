from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.engine.costs import K_MAX
from app.engine.types import DraftSetting
from app.store import BUILTIN_PRESETS, Preset, PresetsFile, is_builtin, remove, upsert


def test_builtins_are_valid_and_distinct() -> None:
    names = [p.name for p in BUILTIN_PRESETS]
    assert names[:4] == ["Balanced", "Precise", "Creative", "Code"]
    assert len(set(names)) == len(names)
    assert all(p.validated() == p for p in BUILTIN_PRESETS)
    by_name = {p.name: p for p in BUILTIN_PRESETS}
    assert by_name["Balanced"] == Preset("Balanced")
    assert (by_name["Creative"].temperature, by_name["Creative"].top_p) == (0.9, 0.95)
    code = by_name["Code"]
    assert code.prompt_lookup and code.temperature == 0 and "code" in code.system_prompt
    # Every built-in preset drafts, and lets the engine plan k from measured costs.
    assert all(p.drafting.k > 0 and p.drafting.auto for p in BUILTIN_PRESETS)
    assert Preset("Mine").drafting.auto


def test_k_runs_to_the_engines_longest_draft() -> None:
    long = Preset("Long", drafting=DraftSetting.fixed(K_MAX))
    assert long.validated().drafting.num_draft == K_MAX == 16


def test_a_missing_file_gives_the_builtins(tmp_path: Path) -> None:
    assert PresetsFile(tmp_path / "presets.json").load() == list(BUILTIN_PRESETS)


def test_round_trip_keeps_builtins_first_and_out_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "presets.json"
    f = PresetsFile(path)
    mine = Preset(
        "Storyteller",
        system_prompt="Tell stories. «Ünïcode»",
        temperature=1.2,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        repetition_penalty=1.1,
        max_tokens=2048,
        seed=7,
        drafting=DraftSetting(6, auto=False),  # not the default, so the file must keep it
        prompt_lookup=True,
    )
    presets = upsert(f.load(), mine)
    f.save(presets)
    assert PresetsFile(path).load() == [*BUILTIN_PRESETS, mine]
    stored = json.loads(path.read_text(encoding="utf-8"))
    assert [p["name"] for p in stored["presets"]] == ["Storyteller"]
    assert [p.name for p in tmp_path.iterdir()] == ["presets.json"]  # no temp file left


def test_upsert_replaces_by_name_and_remove_drops(tmp_path: Path) -> None:
    a, b = Preset("A"), Preset("B", temperature=0.5)
    presets = upsert(upsert([], a), b)
    assert presets == [a, b]
    warmer = Preset("A", temperature=1.0)
    assert upsert(presets, warmer) == [warmer, b]
    assert upsert(presets, Preset("  C  ")) == [a, b, Preset("C")]
    assert remove(presets, "A") == [b]
    assert remove(presets, "nothing") == presets
    assert presets == [a, b]  # the helpers return new lists


def test_builtins_cannot_be_removed_or_replaced() -> None:
    presets = list(BUILTIN_PRESETS)
    assert is_builtin("Code") and not is_builtin("Mine")
    with pytest.raises(ValueError, match="cannot be removed"):
        remove(presets, "Balanced")
    with pytest.raises(ValueError, match="built in"):
        upsert(presets, Preset("Creative", temperature=2.0))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({"name": "x" * 61}, "name"),
        ({"name": "two\nlines"}, "name"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"repetition_penalty": 0.5}, "repetition_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"top_p": float("inf")}, "top_p"),
        ({"repetition_penalty": 2.5}, "repetition_penalty"),
    ],
)
def test_validation_names_the_bad_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field) as raised:
        upsert([], Preset(**{"name": "P", **changes}))  # a range as it is made, a name here
    assert "\n" not in str(raised.value)


def test_validation_accepts_the_edges() -> None:
    edges = Preset("E", temperature=2, top_p=0.0, min_p=1.0, max_tokens=131_072, seed=0)
    assert edges.validated() == edges
    assert Preset(" E ").validated().name == "E"


@pytest.mark.parametrize("content", ["", "{", "[]", '{"presets": 3}', '"text"'])
def test_a_broken_file_gives_the_builtins(tmp_path: Path, content: str) -> None:
    path = tmp_path / "presets.json"
    path.write_text(content)
    assert PresetsFile(path).load() == list(BUILTIN_PRESETS)


def test_malformed_entries_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "presets.json"
    entries = [
        {"name": "Good", "temperature": 1},
        "not an object",
        {"temperature": 0.5},  # no name
        {"name": "Bad type", "top_k": "many"},
        {"name": "Bool for int", "top_k": True},
        {"name": "Out of range", "temperature": 9},
        {"name": "Balanced", "temperature": 1.5},  # built-in names are reserved
        {"name": "Good", "temperature": 0.2},  # the first of a name wins
        {"name": "Seeded", "seed": 3, "unknown": "ignored"},
        {"name": "Bad draft", "drafting": {"k": 99}},
        {"name": "Older", "num_draft": 6, "auto_draft": False},  # before the one setting
    ]
    path.write_text(json.dumps({"version": 1, "presets": entries}))
    loaded = PresetsFile(path).load()
    assert loaded[: len(BUILTIN_PRESETS)] == list(BUILTIN_PRESETS)
    mine = loaded[len(BUILTIN_PRESETS) :]
    older = Preset("Older", drafting=DraftSetting(6, auto=False))
    assert mine == [Preset("Good", temperature=1.0), Preset("Seeded", seed=3), older]
    assert isinstance(mine[0].temperature, float)


def test_default_path_is_in_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.store.presets.default_data_dir", lambda: tmp_path)
    assert PresetsFile().path == tmp_path / "presets.json"
