from __future__ import annotations

import sqlite3
from pathlib import Path

from app.engine.types import Origin, Stats
from app.store import Store


def test_round_trip(tmp_path: Path) -> None:
    db = tmp_path / "t.sqlite3"
    store = Store(db)
    c = store.create_conversation("Sea haiku")
    store.add_message(c.id, "user", "Write a haiku")
    stats = Stats(prompt_tokens=9, tokens=3, drafted=4, accepted=2, ttft_seconds=0.1)
    store.add_message(
        c.id,
        "assistant",
        "Waves fold",
        target="/m/t",
        draft="/m/d",
        finish_reason="stop",
        stats=stats,
        origins=(Origin.DRAFT, Origin.DRAFT, Origin.CORRECTION),
    )
    store.close()

    again = Store(db)
    [conv] = again.conversations()
    assert conv.title == "Sea haiku"
    user, reply = again.messages(conv.id)
    assert (user.role, user.content) == ("user", "Write a haiku")
    assert reply.content == "Waves fold"
    assert (reply.target, reply.draft, reply.finish_reason) == ("/m/t", "/m/d", "stop")
    assert reply.stats == stats
    assert reply.stats is not None and reply.stats.acceptance == 0.5
    assert reply.origins == (Origin.DRAFT, Origin.DRAFT, Origin.CORRECTION)


def test_stopped_reply_is_kept(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation()
    store.add_message(c.id, "assistant", "half a rep", finish_reason="cancelled")
    [m] = Store(tmp_path / "t.sqlite3").messages(c.id)
    assert (m.content, m.finish_reason) == ("half a rep", "cancelled")


def test_conversations_sorted_by_last_use(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    a = store.create_conversation("a")
    store.create_conversation("b")
    assert [c.title for c in store.conversations()] == ["b", "a"]
    store.add_message(a.id, "user", "hi")
    assert [c.title for c in store.conversations()] == ["a", "b"]


def test_delete_removes_messages(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation()
    store.add_message(c.id, "user", "hi")
    store.delete_conversation(c.id)
    assert store.conversations() == []
    assert store.messages(c.id) == []
    assert store.conversation(c.id) is None


def test_database_runs_in_wal_mode(tmp_path: Path) -> None:
    Store(tmp_path / "t.sqlite3")
    mode = sqlite3.connect(tmp_path / "t.sqlite3").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_rename(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation("old")
    store.rename_conversation(c.id, "new")
    assert store.conversation(c.id) is not None
    assert store.conversations()[0].title == "new"
