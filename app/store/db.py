"""Conversations and messages in SQLite.

The database lives under ``platformdirs.user_data_dir("Tandem")`` and runs in
WAL mode so a crash never corrupts it. One :class:`Store` belongs to one thread
(the UI thread); the engine never touches it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from app.engine.types import Origin, Role, Segment, Stats

APP_NAME = "Tandem"
SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content TEXT NOT NULL,
    created_at REAL NOT NULL,
    target TEXT,
    draft TEXT,
    finish_reason TEXT,
    stats TEXT,
    origins TEXT,
    segments TEXT
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""


def default_data_dir() -> Path:
    """Tandem's data folder, created when missing."""
    path = Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True, slots=True)
class Conversation:
    id: int
    title: str
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class StoredMessage:
    id: int
    conversation_id: int
    role: Role
    content: str
    created_at: float
    target: str | None = None
    draft: str | None = None
    finish_reason: str | None = None
    stats: Stats | None = None
    origins: tuple[Origin, ...] = field(default=())
    segments: tuple[Segment, ...] = field(default=())


class Store:
    """Conversations and messages, persisted in SQLite."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_data_dir() / "tandem.sqlite3"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        # executescript commits on its own, so it runs outside _transaction.
        self._db.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} COMMIT;")
        self._migrate()

    def _migrate(self) -> None:
        """Brings a database of an older version up to this one, in place."""
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        with self._transaction() as db:
            columns = {r["name"] for r in db.execute("PRAGMA table_info(messages)")}
            if "segments" not in columns:  # version 1 kept no text by origin
                db.execute("ALTER TABLE messages ADD COLUMN segments TEXT")
            if version != SCHEMA_VERSION:
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # Conversations

    def create_conversation(self, title: str = "New chat") -> Conversation:
        now = time.time()
        with self._transaction() as db:
            cur = db.execute(
                "INSERT INTO conversations (title, created_at, updated_at) VALUES (?, ?, ?)",
                (title, now, now),
            )
        assert cur.lastrowid is not None
        return Conversation(cur.lastrowid, title, now, now)

    def conversations(self) -> list[Conversation]:
        """All conversations, most recently used first."""
        rows = self._db.execute(
            "SELECT id, title, created_at, updated_at FROM conversations "
            "ORDER BY updated_at DESC, id DESC"
        )
        return [Conversation(**dict(r)) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute(
            "SELECT id, title, created_at, updated_at FROM conversations WHERE id = ?",
            (conversation_id,),
        ).fetchone()
        return Conversation(**dict(row)) if row else None

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        with self._transaction() as db:
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # Messages

    def add_message(
        self,
        conversation_id: int,
        role: Role,
        content: str,
        *,
        target: str | None = None,
        draft: str | None = None,
        finish_reason: str | None = None,
        stats: Stats | None = None,
        origins: tuple[Origin, ...] = (),
        segments: tuple[Segment, ...] = (),
    ) -> StoredMessage:
        """Appends a message and marks the conversation as just used.

        ``segments`` is the text in runs by the origin of its tokens, so an old
        reply can be shown coloured again.
        """
        now = time.time()
        stats_json = json.dumps(stats.as_dict()) if stats is not None else None
        origin_codes = "".join(o.code for o in origins) or None
        segments_json = (
            json.dumps([[o.code if o is not None else "", t] for o, t in segments])
            if segments
            else None
        )
        with self._transaction() as db:
            cur = db.execute(
                "INSERT INTO messages (conversation_id, role, content, created_at, target, "
                "draft, finish_reason, stats, origins, segments) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id,
                    role,
                    content,
                    now,
                    target,
                    draft,
                    finish_reason,
                    stats_json,
                    origin_codes,
                    segments_json,
                ),
            )
            db.execute(
                "UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id)
            )
        assert cur.lastrowid is not None
        return StoredMessage(
            cur.lastrowid,
            conversation_id,
            role,
            content,
            now,
            target,
            draft,
            finish_reason,
            stats,
            origins,
            segments,
        )

    def message(self, message_id: int) -> StoredMessage | None:
        row = self._db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        return _message(row) if row is not None else None

    def pair_totals(self, target: str, draft: str | None) -> tuple[int, int]:
        """Accepted and drafted tokens over every saved reply of a pair."""
        rows = self._db.execute(
            "SELECT stats FROM messages WHERE role = 'assistant' AND target = ? "
            "AND draft IS ? AND stats IS NOT NULL",
            (target, draft),
        )
        accepted = drafted = 0
        for (raw,) in rows:
            try:
                data = json.loads(raw)
                accepted += int(data.get("accepted", 0))
                drafted += int(data.get("drafted", 0))
            except (ValueError, TypeError, AttributeError):
                continue  # one damaged row must not hide the rest
        return accepted, drafted

    def recent_prompts(self, limit: int = 20) -> list[str]:
        """The user's latest messages across conversations, oldest first."""
        rows = self._db.execute(
            "SELECT content FROM messages WHERE role = 'user' ORDER BY id DESC LIMIT ?", (limit,)
        )
        return [r[0] for r in rows][::-1]

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        )
        return [_message(r) for r in rows]


def _message(row: sqlite3.Row) -> StoredMessage:
    data: dict[str, Any] = dict(row)
    raw_stats = data.pop("stats")
    stats = Stats.from_dict(json.loads(raw_stats)) if raw_stats else None
    codes = data.pop("origins") or ""
    segments: tuple[Segment, ...] = ()
    try:
        raw = json.loads(data.pop("segments") or "[]")
        segments = tuple((Origin.from_code(c) if c else None, str(t)) for c, t in raw)
    except (ValueError, TypeError):
        pass  # a damaged column loses the colours, not the message
    return StoredMessage(
        **data,
        stats=stats,
        origins=tuple(Origin.from_code(c) for c in codes),
        segments=segments,
    )
