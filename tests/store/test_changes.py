"""The store tells its listeners what each committed write changed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from app.store import Store, StoreChange


def test_every_write_says_what_it_changed(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    changes: list[StoreChange] = []
    store.subscribe(changes.append)
    cid = store.create_conversation("Hi").id
    user = store.add_message(cid, "user", "Hello")
    reply = store.add_message(cid, "assistant", "Hi there")
    store.update_message(reply.id, content="Hi there!")
    store.rename_conversation(cid, "Greeting")
    store.set_system_prompt(cid, "Be brief.")
    other = store.add_message(cid, "assistant", "Hey", parent_id=user.id)
    store.switch_branch(reply.id)
    store.delete_message(other.id)
    copy = store.duplicate_conversation(cid)
    [imported] = store.import_json(store.export_json([cid]))
    store.delete_conversation(cid)
    assert changes == [
        StoreChange("conversation", (cid,)),
        StoreChange("messages", (cid,)),
        StoreChange("messages", (cid,)),
        StoreChange("messages", (cid,)),
        StoreChange("conversation", (cid,)),
        StoreChange("conversation", (cid,)),
        StoreChange("messages", (cid,)),
        StoreChange("messages", (cid,)),  # another branch on show
        StoreChange("messages", (cid,)),
        StoreChange("conversation", (copy.id,)),
        StoreChange("conversation", (imported,)),
        StoreChange("deleted", (cid,)),
    ]
    store.close()


def test_reads_failed_writes_and_unsubscribed_listeners_hear_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    heard: list[StoreChange] = []
    unsubscribe = store.subscribe(heard.append)
    cid = store.create_conversation("Hi").id
    heard.clear()
    store.conversations()
    store.messages(cid)
    store.search("hello")
    with pytest.raises(ValueError):
        store.update_message(999, content="nope")
    with pytest.raises((ValueError, sqlite3.Error)):
        store.import_json({"not": "an archive"})
    assert heard == []
    unsubscribe()
    store.rename_conversation(cid, "Still")
    assert heard == [] and store.conversation(cid).title == "Still"  # type: ignore[union-attr]
    store.close()
