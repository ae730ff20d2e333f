"""Conversations and messages in SQLite.

The database lives under ``platformdirs.user_data_dir("Tandem")`` and runs in
WAL mode so a crash never corrupts it. One :class:`Store` belongs to one thread
(the UI thread); the engine never touches it.

Messages form a tree per conversation: each points at the message before it in
its branch (``parent_id``), and the conversation remembers the leaf of the
branch on screen (``head_id``). A full-text index (FTS5) over the messages is
kept in sync by triggers.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Final, Literal

import platformdirs

from app.engine.types import Origin, Role, Segment, Stats
from app.store.snippets import snippet

APP_NAME = "Tandem"
SCHEMA_VERSION = 3

# head_id and parent_id carry no foreign keys: the store keeps them consistent
# (a parent is always an older message of the same conversation).
_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    system_prompt TEXT,
    head_id INTEGER
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
    segments TEXT,
    parent_id INTEGER
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""

# Run after the columns exist, so on a migrated database too. The FTS table has
# external content: it stores only the index and reads text from messages.
_INDEXES_AND_SEARCH = (
    "CREATE INDEX IF NOT EXISTS messages_by_parent ON messages(conversation_id, parent_id, id)",
    "CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(content, content='messages', "
    "content_rowid='id', tokenize='unicode61 remove_diacritics 2')",
    "CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages BEGIN "
    "INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END",
    "CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages BEGIN "
    "INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);"
    " END",
    "CREATE TRIGGER IF NOT EXISTS messages_fts_update AFTER UPDATE OF content ON messages BEGIN "
    "INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);"
    " INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END",
)

_CONVERSATION_COLUMNS = "id, title, created_at, updated_at, system_prompt, head_id"


class _Unset(Enum):
    TOKEN = 0


_UNSET: Final = _Unset.TOKEN
"""Default of ``add_message(parent_id=...)``: append to the head."""


def default_data_dir() -> Path:
    """Tandem's data folder, created when missing."""
    path = Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation; ``head_id`` is the last message of the branch on screen."""

    id: int
    title: str
    created_at: float
    updated_at: float
    system_prompt: str | None = None
    head_id: int | None = None


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
    parent_id: int | None = None


@dataclass(frozen=True, slots=True)
class StoreChange:
    """What one write changed, as the store tells its listeners once it is committed.

    Attributes:
        kind: ``"conversation"`` (added, renamed or its system prompt),
            ``"deleted"`` (the conversation is gone) or ``"messages"`` (a message
            added, updated or deleted, or another branch shown: what the
            conversation shows changed).
        conversation_ids: The conversations it touched.
    """

    kind: Literal["conversation", "deleted", "messages"]
    conversation_ids: tuple[int, ...]


StoreListener = Callable[[StoreChange], None]


@dataclass(frozen=True, slots=True)
class SearchHit:
    """A message that matches a search; ``snippet`` (:mod:`app.store.snippets`) marks the
    matched words with «»."""

    conversation_id: int
    message_id: int
    title: str
    snippet: str


class Store:
    """Conversations and messages, persisted in SQLite.

    Each conversation is a tree of messages; :meth:`messages` gives the branch
    that ends at the conversation's head. The two ways of branching:

    * Editing a user message ``m``: ``add_message(cid, "user", new_text,
      parent_id=m.parent_id)``, a sibling of ``m`` that becomes the head.
    * Regenerating a reply ``r``: ``add_message(cid, "assistant", text,
      parent_id=r.parent_id)`` (the user message it answers).

    :meth:`siblings` lists the alternatives at a point (shown as "< 2/3 >") and
    :meth:`switch_branch` brings one of them on screen.
    """

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
        self._listeners: list[StoreListener] = []

    def subscribe(self, listener: StoreListener) -> Callable[[], None]:
        """Calls ``listener`` with a :class:`StoreChange` after each committed write.

        Returns:
            A function that unsubscribes it.
        """
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _changed(self, kind: Literal["conversation", "deleted", "messages"], *ids: int) -> None:
        change = StoreChange(kind, ids)
        for listener in list(self._listeners):
            listener(change)

    def _migrate(self) -> None:
        """Brings a database of an older version up to this one, in place."""
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        with self._transaction() as db:
            columns = {r["name"] for r in db.execute("PRAGMA table_info(messages)")}
            if "segments" not in columns:  # version 1 kept no text by origin
                db.execute("ALTER TABLE messages ADD COLUMN segments TEXT")
            if "parent_id" not in columns:  # before version 3 every chat was linear
                db.execute("ALTER TABLE messages ADD COLUMN parent_id INTEGER")
                db.execute(
                    "UPDATE messages SET parent_id = (SELECT MAX(p.id) FROM messages AS p "
                    "WHERE p.conversation_id = messages.conversation_id AND p.id < messages.id)"
                )
            columns = {r["name"] for r in db.execute("PRAGMA table_info(conversations)")}
            if "system_prompt" not in columns:
                db.execute("ALTER TABLE conversations ADD COLUMN system_prompt TEXT")
            if "head_id" not in columns:
                db.execute("ALTER TABLE conversations ADD COLUMN head_id INTEGER")
                db.execute(
                    "UPDATE conversations SET head_id = "
                    "(SELECT MAX(id) FROM messages WHERE conversation_id = conversations.id)"
                )
            had_index = db.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'messages_fts'"
            ).fetchone()
            for statement in _INDEXES_AND_SEARCH:
                db.execute(statement)
            if not had_index:  # index the messages written before search existed
                db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")
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

    def create_conversation(
        self, title: str = "New chat", system_prompt: str | None = None
    ) -> Conversation:
        now = time.time()
        system_prompt = system_prompt or None
        with self._transaction() as db:
            cur = db.execute(
                "INSERT INTO conversations (title, created_at, updated_at, system_prompt) "
                "VALUES (?, ?, ?, ?)",
                (title, now, now, system_prompt),
            )
        assert cur.lastrowid is not None
        self._changed("conversation", cur.lastrowid)
        return Conversation(cur.lastrowid, title, now, now, system_prompt)

    def conversations(self) -> list[Conversation]:
        """All conversations, most recently used first."""
        rows = self._db.execute(
            f"SELECT {_CONVERSATION_COLUMNS} FROM conversations ORDER BY updated_at DESC, id DESC"
        )
        return [Conversation(**dict(r)) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute(
            f"SELECT {_CONVERSATION_COLUMNS} FROM conversations WHERE id = ?",
            (conversation_id,),
        ).fetchone()
        return Conversation(**dict(row)) if row else None

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        with self._transaction() as db:
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))
        self._changed("conversation", conversation_id)

    def set_system_prompt(self, conversation_id: int, text: str | None) -> None:
        """Sets the conversation's system prompt; ``None`` or ``""`` removes it."""
        with self._transaction() as db:
            db.execute(
                "UPDATE conversations SET system_prompt = ? WHERE id = ?",
                (text or None, conversation_id),
            )
        self._changed("conversation", conversation_id)

    def delete_conversation(self, conversation_id: int) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        self._changed("deleted", conversation_id)

    def duplicate_conversation(
        self, conversation_id: int, title: str | None = None
    ) -> Conversation:
        """Copies a conversation with every branch, its head and its system prompt.

        Args:
            conversation_id: The conversation to copy.
            title: Title of the copy; ``"<title> (copy)"`` when ``None``.

        Returns:
            The new conversation, marked as just used.

        Raises:
            ValueError: No such conversation.
        """
        source = self.conversation(conversation_id)
        if source is None:
            raise ValueError(f"no conversation {conversation_id}")
        now = time.time()
        copy = Conversation(
            0,
            title if title is not None else f"{source.title} (copy)",
            now,
            now,
            source.system_prompt,
            source.head_id,
        )
        with self._transaction() as db:
            new_id = self._insert_conversation(db, copy, self._tree(conversation_id))
        self._changed("conversation", new_id)
        new = self.conversation(new_id)
        assert new is not None
        return new

    def _insert_conversation(
        self, db: sqlite3.Connection, conversation: Conversation, tree: Iterable[StoredMessage]
    ) -> int:
        """Inserts a conversation and its messages under new ids; returns its id.

        ``tree`` must list every parent before its children; ids and parent ids
        are the old ones and get remapped, ``conversation.head_id`` too.
        """
        cur = db.execute(
            "INSERT INTO conversations (title, created_at, updated_at, system_prompt) "
            "VALUES (?, ?, ?, ?)",
            (
                conversation.title,
                conversation.created_at,
                conversation.updated_at,
                conversation.system_prompt,
            ),
        )
        cid = cur.lastrowid
        assert cid is not None
        new_ids: dict[int, int] = {}
        for m in tree:
            parent = new_ids[m.parent_id] if m.parent_id is not None else None
            new_ids[m.id] = _insert_message(
                db,
                cid,
                parent,
                m.role,
                m.content,
                m.created_at,
                m.target,
                m.draft,
                m.finish_reason,
                m.stats,
                m.origins,
                m.segments,
            )
        if conversation.head_id is not None:
            db.execute(
                "UPDATE conversations SET head_id = ? WHERE id = ?",
                (new_ids[conversation.head_id], cid),
            )
        return cid

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
        parent_id: int | Literal[_Unset.TOKEN] | None = _UNSET,
    ) -> StoredMessage:
        """Adds a message, makes it the head and marks the conversation as just used.

        ``segments`` is the text in runs by the origin of its tokens, so an old
        reply can be shown coloured again.

        Args:
            parent_id: The message it follows. Left out, the conversation's head
                (a plain append); given, a new branch starts there (``None``
                starts a new root).

        Raises:
            ValueError: ``parent_id`` is not a message of this conversation.
        """
        now = time.time()
        with self._transaction() as db:
            if parent_id is _UNSET:
                row = db.execute(
                    "SELECT head_id FROM conversations WHERE id = ?", (conversation_id,)
                ).fetchone()
                parent = row[0] if row is not None else None
            else:
                parent = parent_id
                if parent is not None and self._conversation_of(parent) != conversation_id:
                    raise ValueError(f"message {parent} is not in conversation {conversation_id}")
            message_id = _insert_message(
                db,
                conversation_id,
                parent,
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
            db.execute(
                "UPDATE conversations SET updated_at = ?, head_id = ? WHERE id = ?",
                (now, message_id, conversation_id),
            )
        self._changed("messages", conversation_id)
        return StoredMessage(
            message_id,
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
            parent,
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
        """The branch on screen: from its first message to the head, in order."""
        rows = self._db.execute(
            "WITH RECURSIVE branch(id, depth) AS ("
            " SELECT head_id, 0 FROM conversations WHERE id = ? AND head_id IS NOT NULL"
            " UNION ALL"
            " SELECT m.parent_id, b.depth + 1 FROM messages AS m JOIN branch AS b ON m.id = b.id"
            " WHERE m.parent_id IS NOT NULL"
            ") SELECT m.* FROM branch AS b JOIN messages AS m ON m.id = b.id ORDER BY b.depth DESC",
            (conversation_id,),
        )
        return [_message(r) for r in rows]

    def _tree(self, conversation_id: int) -> list[StoredMessage]:
        """Every message of every branch, oldest first (so parents come first)."""
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        )
        return [_message(r) for r in rows]

    def siblings(self, message_id: int) -> list[int]:
        """The alternatives at a message's place, itself included, oldest first.

        They are the messages of its conversation with the same parent; an
        unknown message has none.
        """
        row = self._db.execute(
            "SELECT conversation_id, parent_id FROM messages WHERE id = ?", (message_id,)
        ).fetchone()
        if row is None:
            return []
        rows = self._db.execute(
            "SELECT id FROM messages WHERE conversation_id = ? AND parent_id IS ? ORDER BY id",
            (row[0], row[1]),
        )
        return [r[0] for r in rows]

    def branches(self, conversation_id: int) -> dict[int, tuple[int, int]]:
        """Each message that has alternatives: its place among them (1-based) and their count.

        One query for the whole conversation, where :meth:`siblings` asks per message.
        """
        rows = self._db.execute(
            "SELECT id, parent_id FROM messages WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        )
        groups: dict[int | None, list[int]] = {}
        for message_id, parent_id in rows:
            groups.setdefault(parent_id, []).append(message_id)
        return {
            m: (i + 1, len(ids))
            for ids in groups.values()
            if len(ids) > 1
            for i, m in enumerate(ids)
        }

    def switch_branch(self, message_id: int) -> None:
        """Brings a message's branch on screen.

        The head becomes the newest leaf below the message, reached by always
        following the newest child.

        Raises:
            ValueError: No such message.
        """
        cid = self._conversation_of(message_id)
        if cid is None:
            raise ValueError(f"no message {message_id}")
        with self._transaction() as db:
            db.execute(
                "UPDATE conversations SET head_id = ? WHERE id = ?",
                (self._leaf(cid, message_id), cid),
            )
        self._changed("messages", cid)  # other messages are on show

    def delete_message(self, message_id: int) -> None:
        """Deletes a message and everything below it; an unknown one is ignored.

        When the head was among them, the head moves to the newest remaining
        sibling's leaf, else to the deleted message's parent (or to nothing).
        """
        row = self._db.execute(
            "SELECT conversation_id, parent_id FROM messages WHERE id = ?", (message_id,)
        ).fetchone()
        if row is None:
            return
        cid, parent = row
        with self._transaction() as db:
            doomed = [
                r[0]
                for r in db.execute(
                    "WITH RECURSIVE below(id) AS (SELECT ? UNION ALL SELECT m.id "
                    "FROM messages AS m JOIN below AS b ON m.parent_id = b.id "
                    "WHERE m.conversation_id = ?) SELECT id FROM below",
                    (message_id, cid),
                )
            ]
            db.executemany("DELETE FROM messages WHERE id = ?", [(i,) for i in doomed])
            head = db.execute("SELECT head_id FROM conversations WHERE id = ?", (cid,)).fetchone()
            if head is not None and head[0] in doomed:
                sibling = db.execute(
                    "SELECT MAX(id) FROM messages WHERE conversation_id = ? AND parent_id IS ?",
                    (cid, parent),
                ).fetchone()[0]
                new_head = self._leaf(cid, sibling) if sibling is not None else parent
                db.execute("UPDATE conversations SET head_id = ? WHERE id = ?", (new_head, cid))
        self._changed("messages", cid)

    def _conversation_of(self, message_id: int) -> int | None:
        row = self._db.execute(
            "SELECT conversation_id FROM messages WHERE id = ?", (message_id,)
        ).fetchone()
        return row[0] if row is not None else None

    def _leaf(self, conversation_id: int, message_id: int) -> int:
        """The newest leaf below a message, following the newest child each time."""
        while True:
            child = self._db.execute(
                "SELECT MAX(id) FROM messages WHERE conversation_id = ? AND parent_id = ?",
                (conversation_id, message_id),
            ).fetchone()[0]
            if child is None:
                return message_id
            message_id = child

    # Search

    def search(self, query: str, limit: int = 50) -> list[SearchHit]:
        """Messages of any branch that contain every word of ``query`` (as prefixes).

        Hits come by their conversation's last use, then by relevance. Any text
        is a valid query: each word is quoted, so FTS syntax has no effect.
        """
        match = _fts_query(query)
        if not match or limit <= 0:
            return []
        rows = self._db.execute(
            "SELECT m.conversation_id, m.id, c.title, m.content "
            "FROM messages_fts JOIN messages AS m ON m.id = messages_fts.rowid "
            "JOIN conversations AS c ON c.id = m.conversation_id "
            "WHERE messages_fts MATCH ? "
            "ORDER BY c.updated_at DESC, c.id DESC, messages_fts.rank, m.id",
            (match,),
        )
        # A hit whose words are only in a reply's reasoning markup is none: rows are
        # read until ``limit`` others are found.
        hits = ((c, m, t, snippet(text, query)) for c, m, t, text in rows)
        found = (SearchHit(c, m, t, s) for c, m, t, s in hits if s is not None)
        return list(itertools.islice(found, limit))

    # Export and import

    def export_markdown(self, conversation_id: int) -> str:
        """The branch on screen as Markdown, under the title and the system prompt.

        Raises:
            ValueError: No such conversation.
        """
        # Imported here as export builds on this module's types.
        from app.store.export import to_markdown

        conversation = self.conversation(conversation_id)
        if conversation is None:
            raise ValueError(f"no conversation {conversation_id}")
        return to_markdown(conversation, self.messages(conversation_id))

    def export_json(self, conversation_ids: Sequence[int] | None = None) -> dict[str, Any]:
        """Conversations with every branch, as a JSON-ready archive.

        Args:
            conversation_ids: Which to export, in this order; all of them (most
                recently used first) when ``None``.

        Raises:
            ValueError: One of the ids names no conversation.
        """
        from app.store.export import to_archive

        if conversation_ids is None:
            chosen = self.conversations()
        else:
            chosen = []
            for cid in conversation_ids:
                conversation = self.conversation(cid)
                if conversation is None:
                    raise ValueError(f"no conversation {cid}")
                chosen.append(conversation)
        return to_archive([(c, self._tree(c.id)) for c in chosen])

    def import_json(self, data: Any) -> list[int]:
        """Adds the conversations of an archive from :meth:`export_json` as new ones.

        Message trees, heads, system prompts and times are kept; ids are new.

        Returns:
            The new conversations' ids, in the archive's order.

        Raises:
            ValueError: The archive is not valid (one line says why); nothing is
                imported then.
        """
        from app.store.export import from_archive

        archived = from_archive(data)
        with self._transaction() as db:
            ids = [self._insert_conversation(db, c, tree) for c, tree in archived]
        if ids:
            self._changed("conversation", *ids)
        return ids

    def update_message(
        self,
        message_id: int,
        *,
        content: str,
        finish_reason: str | None = None,
        stats: Stats | None = None,
        origins: tuple[Origin, ...] = (),
        segments: tuple[Segment, ...] = (),
    ) -> StoredMessage:
        """Replaces a message's text and reply details in place; search follows.

        A streaming reply is saved as it grows, so a crash keeps it up to its
        last save. Its place, branch and pair stay as they were.

        Raises:
            ValueError: No such message.
        """
        with self._transaction() as db:
            cur = db.execute(
                "UPDATE messages SET content = ?, finish_reason = ?, stats = ?, origins = ?, "
                "segments = ? WHERE id = ?",
                (content, finish_reason, *_encoded(stats, origins, segments), message_id),
            )
            if cur.rowcount == 0:
                raise ValueError(f"no message {message_id}")
        updated = self.message(message_id)
        assert updated is not None
        self._changed("messages", updated.conversation_id)
        return updated


def _fts_query(text: str) -> str:
    """An FTS5 query matching every word of ``text`` as a prefix, never a syntax error."""
    return " ".join('"' + word.replace('"', '""') + '"*' for word in text.split())


def _insert_message(
    db: sqlite3.Connection,
    conversation_id: int,
    parent_id: int | None,
    role: Role,
    content: str,
    created_at: float,
    target: str | None,
    draft: str | None,
    finish_reason: str | None,
    stats: Stats | None,
    origins: tuple[Origin, ...],
    segments: tuple[Segment, ...],
) -> int:
    """Inserts one message row; returns its id."""
    stats_json, origin_codes, segments_json = _encoded(stats, origins, segments)
    cur = db.execute(
        "INSERT INTO messages (conversation_id, parent_id, role, content, created_at, target, "
        "draft, finish_reason, stats, origins, segments) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            conversation_id,
            parent_id,
            role,
            content,
            created_at,
            target,
            draft,
            finish_reason,
            stats_json,
            origin_codes,
            segments_json,
        ),
    )
    assert cur.lastrowid is not None
    return cur.lastrowid


def _encoded(
    stats: Stats | None, origins: tuple[Origin, ...], segments: tuple[Segment, ...]
) -> tuple[str | None, str | None, str | None]:
    """A reply's stats, origins and segments as their columns hold them."""
    stats_json = json.dumps(stats.as_dict()) if stats is not None else None
    origin_codes = "".join(o.code for o in origins) or None
    segments_json = (
        json.dumps([[o.code if o is not None else "", t] for o, t in segments])
        if segments
        else None
    )
    return stats_json, origin_codes, segments_json


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
