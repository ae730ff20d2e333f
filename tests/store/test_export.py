from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from app.engine.types import Origin, Stats
from app.store import Store


def _branched(store: Store) -> int:
    """A conversation with a system prompt, a regenerated reply and rich stats."""
    c = store.create_conversation("Sea haiku")
    store.set_system_prompt(c.id, "You are a poet.\n\nBe brief.")
    q = store.add_message(c.id, "user", "Write a haiku")
    store.add_message(
        c.id,
        "assistant",
        "Waves fold",
        target="/m/t",
        draft="/m/d",
        finish_reason="stop",
        stats=Stats(tokens=3, drafted=4, accepted=2, generation_seconds=0.5, num_draft=None),
        origins=(Origin.DRAFT, Origin.DRAFT, Origin.CORRECTION),
        segments=((Origin.DRAFT, "Waves"), (None, " fold")),
    )
    store.add_message(c.id, "assistant", "Salt wind sings", parent_id=q.id, finish_reason="stop")
    store.add_message(c.id, "user", "Another")
    return c.id


def test_markdown_shows_the_branch_on_screen(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    cid = _branched(store)
    text = store.export_markdown(cid)
    assert text == (
        "# Sea haiku\n\n"
        "**System prompt**\n\n> You are a poet.\n>\n> Be brief.\n\n"
        "**You**\n\nWrite a haiku\n\n"
        "**Tandem**\n\nSalt wind sings\n\n"
        "**You**\n\nAnother\n"
    )
    store.switch_branch(store.siblings(store.messages(cid)[1].id)[0])
    text = store.export_markdown(cid)
    assert "Waves fold\n\n*3 tokens · 6.0 tok/s · 50% of drafted tokens accepted*" in text
    assert "Salt wind" not in text and "Another" not in text
    with pytest.raises(ValueError):
        store.export_markdown(10_000)


def test_markdown_folds_a_replys_thoughts_and_hides_their_markup(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation("Sums")
    store.add_message(c.id, "user", "<think> is how I start")  # a user's text stays as typed
    store.add_message(c.id, "assistant", "<think>\nAdd them.\n</think>\n\nFour.")
    store.add_message(c.id, "assistant", "<think>\nHalf a thought")  # stopped while thinking
    text = store.export_markdown(c.id)
    assert "**You**\n\n<think> is how I start\n\n" in text
    folded = "<details><summary>Thinking</summary>\n\nAdd them.\n\n</details>\n\nFour.\n\n"
    assert f"**Tandem**\n\n{folded}" in text
    assert text.endswith("<details><summary>Thinking</summary>\n\nHalf a thought\n\n</details>\n")
    assert "</think>" not in text


def test_json_export_has_every_branch(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    cid = _branched(store)
    data = store.export_json()
    assert (data["format"], data["version"]) == ("tandem-conversations", 1)
    [conv] = data["conversations"]
    assert conv["title"] == "Sea haiku"
    assert conv["system_prompt"] == "You are a poet.\n\nBe brief."
    assert conv["head_id"] == store.messages(cid)[-1].id
    assert [m["content"] for m in conv["messages"]] == [
        "Write a haiku",
        "Waves fold",
        "Salt wind sings",
        "Another",
    ]
    q, waves, salt, another = conv["messages"]
    assert waves["parent_id"] == salt["parent_id"] == q["id"]
    assert another["parent_id"] == salt["id"] and q["parent_id"] is None
    assert waves["origins"] == "ddc" and waves["segments"] == [["d", "Waves"], ["", " fold"]]
    assert waves["stats"]["accepted"] == 2 and waves["stats"]["num_draft"] is None
    assert (waves["target"], waves["draft"], waves["finish_reason"]) == ("/m/t", "/m/d", "stop")
    json.dumps(data)  # plain JSON values only


def test_json_export_of_chosen_conversations(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    a = store.create_conversation("a")
    b = store.create_conversation("b")
    assert [c["title"] for c in store.export_json()["conversations"]] == ["b", "a"]
    assert [c["title"] for c in store.export_json([a.id])["conversations"]] == ["a"]
    assert [c["title"] for c in store.export_json([a.id, b.id])["conversations"]] == ["a", "b"]
    assert store.export_json([])["conversations"] == []
    with pytest.raises(ValueError, match="no conversation"):
        store.export_json([a.id, 10_000])


def _without_ids(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The archive's conversations with ids replaced by positions, to compare copies."""
    out = []
    for conv in data["conversations"]:
        index = {m["id"]: i for i, m in enumerate(conv["messages"])}
        messages = [
            {**m, "id": index[m["id"]], "parent_id": index.get(m["parent_id"])}
            for m in conv["messages"]
        ]
        out.append(
            {**conv, "id": None, "head_id": index.get(conv["head_id"]), "messages": messages}
        )
    return out


def test_import_of_an_export_recreates_the_conversations(tmp_path: Path) -> None:
    source = Store(tmp_path / "a.sqlite3")
    cid = _branched(source)
    source.create_conversation("Empty")
    data = json.loads(json.dumps(source.export_json()))

    target = Store(tmp_path / "b.sqlite3")
    target.create_conversation("Already here")
    new_ids = target.import_json(data)
    assert len(new_ids) == 2
    assert _without_ids(target.export_json(new_ids)) == _without_ids(data)
    assert [c.title for c in map(target.conversation, new_ids) if c] == ["Empty", "Sea haiku"]
    assert [m.content for m in target.messages(new_ids[1])] == [
        m.content for m in source.messages(cid)
    ]
    assert len(target.conversations()) == 3
    # Importing into the same store makes copies with new ids.
    old_ids = {c.id for c in source.conversations()}
    again = source.import_json(data)
    assert not set(again) & old_ids and len(source.conversations()) == 4
    assert [m.content for m in source.messages(again[1])] == [
        m.content for m in source.messages(cid)
    ]


def test_import_orders_parents_before_children(tmp_path: Path) -> None:
    data = {
        "format": "tandem-conversations",
        "version": 1,
        "conversations": [
            {
                "title": "Hand made",
                "head_id": 3,
                "messages": [
                    {"id": 3, "parent_id": 9, "role": "assistant", "content": "c"},
                    {"id": 9, "parent_id": 1, "role": "user", "content": "b"},
                    {"id": 1, "parent_id": None, "role": "user", "content": "a"},
                    {"id": 2, "parent_id": 1, "role": "assistant", "content": "b2"},
                ],
            }
        ],
    }
    store = Store(tmp_path / "t.sqlite3")
    [cid] = store.import_json(data)
    branch = store.messages(cid)
    assert [m.content for m in branch] == ["a", "b", "c"]
    # Siblings keep the archive's order: id 2 before id 9.
    siblings = [store.message(i) for i in store.siblings(branch[1].id)]
    assert [m.content for m in siblings if m] == ["b2", "b"]
    assert branch[0].stats is None and branch[0].origins == () and branch[0].target is None


def _broken(change: str) -> dict[str, Any]:
    data: dict[str, Any] = {
        "format": "tandem-conversations",
        "version": 1,
        "conversations": [
            {"title": "Fine", "head_id": None, "messages": []},
            {
                "title": "Broken",
                "system_prompt": None,
                "head_id": 2,
                "created_at": 1.0,
                "updated_at": 2.0,
                "messages": [
                    {"id": 1, "parent_id": None, "role": "user", "content": "q"},
                    {"id": 2, "parent_id": 1, "role": "assistant", "content": "a"},
                ],
            },
        ],
    }
    conv = data["conversations"][1]
    message = conv["messages"][1]
    match change:
        case "format":
            data["format"] = "something-else"
        case "version":
            data["version"] = 2
        case "bool version":
            data["version"] = True
        case "conversations":
            data["conversations"] = {"a": 1}
        case "conversation":
            data["conversations"][1] = "text"
        case "title":
            del conv["title"]
        case "times":
            conv["created_at"] = "yesterday"
        case "messages":
            conv["messages"] = None
        case "message":
            conv["messages"][1] = []
        case "role":
            message["role"] = "robot"
        case "content":
            message["content"] = 5
        case "id":
            message["id"] = "2"
        case "missing parent":
            del message["parent_id"]
        case "unknown parent":
            message["parent_id"] = 7
        case "same id":
            message["id"] = 1
        case "cycle":
            conv["messages"][0]["parent_id"] = 2
        case "unknown head":
            conv["head_id"] = 5
        case "no head":
            conv["head_id"] = None
        case "stats":
            message["stats"] = {"tokens": "many"}
        case "float for int stat":
            message["stats"] = {"tokens": 1.5}
        case "origins":
            message["origins"] = "dx"
        case "segments":
            message["segments"] = [["d"]]
        case "segment code":
            message["segments"] = [["td", "a"]]
        case "target":
            message["target"] = ["/m"]
    return data


@pytest.mark.parametrize(
    "change",
    [
        "format",
        "version",
        "bool version",
        "conversations",
        "conversation",
        "title",
        "times",
        "messages",
        "message",
        "role",
        "content",
        "id",
        "missing parent",
        "unknown parent",
        "same id",
        "cycle",
        "unknown head",
        "no head",
        "stats",
        "float for int stat",
        "origins",
        "segments",
        "segment code",
        "target",
    ],
)
def test_a_broken_archive_imports_nothing(tmp_path: Path, change: str) -> None:
    store = Store(tmp_path / "t.sqlite3")
    store.import_json(_broken("none"))  # the untouched archive is valid
    before = store.export_json()
    with pytest.raises(ValueError) as raised:
        store.import_json(_broken(change))
    assert "\n" not in str(raised.value) and str(raised.value)
    assert store.export_json() == before


@pytest.mark.parametrize("data", [None, [], "tandem", {"format": "tandem-conversations"}])
def test_not_an_archive(tmp_path: Path, data: Any) -> None:
    store = Store(tmp_path / "t.sqlite3")
    with pytest.raises(ValueError):
        store.import_json(data)
    assert store.conversations() == []


def test_the_archive_passed_in_is_not_changed(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    _branched(store)
    data = store.export_json()
    kept = copy.deepcopy(data)
    store.import_json(data)
    assert data == kept
