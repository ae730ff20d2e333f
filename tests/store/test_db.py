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


def test_segments_round_trip(tmp_path: Path) -> None:
    from app.engine.types import Origin

    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation()
    segments = ((Origin.DRAFT, "Hello"), (Origin.BONUS, ","), (None, " wörld"))
    store.add_message(c.id, "assistant", "Hello, wörld", segments=segments)
    store.add_message(c.id, "user", "plain")
    reply, user = store.messages(c.id)
    assert reply.segments == segments
    assert user.segments == ()
    store.close()


def test_a_version_1_database_is_migrated_in_place(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(
        """
        CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL,
            created_at REAL NOT NULL, updated_at REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL,
            role TEXT NOT NULL, content TEXT NOT NULL, created_at REAL NOT NULL,
            target TEXT, draft TEXT, finish_reason TEXT, stats TEXT, origins TEXT);
        INSERT INTO conversations VALUES (1, 'Old chat', 1.0, 1.0);
        INSERT INTO messages (conversation_id, role, content, created_at, origins)
            VALUES (1, 'assistant', 'kept', 1.0, 'td');
        PRAGMA user_version=1;
        """
    )
    old.close()
    store = Store(path)
    [m] = store.messages(1)
    assert (m.content, m.segments, len(m.origins)) == ("kept", (), 2)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == 2
    store.add_message(1, "assistant", "new", segments=((None, "new"),))
    assert store.messages(1)[-1].segments == ((None, "new"),)
    store.close()


def test_damaged_segments_lose_colours_not_the_message(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation()
    m = store.add_message(c.id, "assistant", "text")
    store._db.execute("UPDATE messages SET segments = '{bad' WHERE id = ?", (m.id,))
    [back] = store.messages(c.id)
    assert back.content == "text" and back.segments == ()
    store.close()


def test_pair_totals_and_recent_prompts(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation()
    store.add_message(c.id, "user", "first")
    for accepted, drafted, draft in ((3, 4, "d"), (5, 8, "d"), (9, 9, "other"), (1, 2, None)):
        store.add_message(
            c.id,
            "assistant",
            "r",
            target="t",
            draft=draft,
            stats=Stats(drafted=drafted, accepted=accepted),
        )
    store.add_message(c.id, "user", "second")
    store.add_message(c.id, "assistant", "no stats", target="t", draft="d")
    assert store.pair_totals("t", "d") == (8, 12)
    assert store.pair_totals("t", None) == (1, 2)
    assert store.pair_totals("x", "d") == (0, 0)
    assert store.recent_prompts() == ["first", "second"]
    assert store.recent_prompts(limit=1) == ["second"]
    m = store.messages(c.id)[1]
    assert store.message(m.id) == m and store.message(10_000) is None
    store.close()
