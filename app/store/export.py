"""Conversations as Markdown, and as a JSON archive that imports back.

The archive keeps every branch::

    {"format": "tandem-conversations", "version": 1, "conversations": [
        {"id", "title", "system_prompt", "head_id", "created_at", "updated_at",
         "messages": [{"id", "parent_id", "role", "content", "created_at", "target",
                       "draft", "finish_reason", "stats", "origins", "segments"}]}]}

Ids matter only inside one archive: they tie parents, children and heads
together, and an import gives new ones.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from app.engine.types import Origin, Segment, Stats
from app.store import reasoning
from app.store.db import Conversation, StoredMessage

FORMAT = "tandem-conversations"
VERSION = 1

_ROLES = ("system", "user", "assistant")
_CODES = frozenset(o.code for o in Origin)
_HEADINGS = {"system": "**System**", "user": "**You**", "assistant": "**Tandem**"}


# Markdown


def to_markdown(conversation: Conversation, branch: Sequence[StoredMessage]) -> str:
    """The title as a heading, the system prompt quoted, then each message."""
    parts = [f"# {' '.join(conversation.title.split()) or 'Untitled'}"]
    if conversation.system_prompt:
        quoted = "\n".join(f"> {line}".rstrip() for line in conversation.system_prompt.split("\n"))
        parts.append(f"**System prompt**\n\n{quoted}")
    for m in branch:
        content = _folded(m.content) if m.role == "assistant" else m.content
        section = f"{_HEADINGS[m.role]}\n\n{content}"
        if m.role == "assistant" and (line := _stats_line(m)):
            section += f"\n\n{line}"
        parts.append(section)
    return "\n\n".join(parts) + "\n"


def _folded(text: str) -> str:
    """A reply with its thoughts in a ``<details>`` block (GitHub, Obsidian and others fold
    it), their markup left out; a reply without thoughts as it is."""
    if not reasoning.has_reasoning(text):
        return text
    thoughts, answer = reasoning.split(text)
    folded = f"<details><summary>Thinking</summary>\n\n{thoughts}\n\n</details>" if thoughts else ""
    return "\n\n".join(part for part in (folded, answer) if part)


def _stats_line(m: StoredMessage) -> str:
    """Tokens, speed and acceptance of a reply, in italics; ``""`` without stats."""
    if m.stats is None or not m.stats.tokens:
        return ""
    bits = [f"{m.stats.tokens} tokens"]
    if m.stats.generation_tps:
        bits.append(f"{m.stats.generation_tps:.1f} tok/s")
    if m.stats.acceptance is not None:
        bits.append(f"{m.stats.acceptance:.0%} of drafted tokens accepted")
    return f"*{' · '.join(bits)}*"


# Export


def to_archive(
    conversations: Sequence[tuple[Conversation, Sequence[StoredMessage]]],
) -> dict[str, Any]:
    """The archive of conversations, each with all its messages."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "conversations": [_conversation_record(c, tree) for c, tree in conversations],
    }


def _conversation_record(c: Conversation, tree: Sequence[StoredMessage]) -> dict[str, Any]:
    return {
        "id": c.id,
        "title": c.title,
        "system_prompt": c.system_prompt,
        "head_id": c.head_id,
        "created_at": c.created_at,
        "updated_at": c.updated_at,
        "messages": [_message_record(m) for m in tree],
    }


def _message_record(m: StoredMessage) -> dict[str, Any]:
    return {
        "id": m.id,
        "parent_id": m.parent_id,
        "role": m.role,
        "content": m.content,
        "created_at": m.created_at,
        "target": m.target,
        "draft": m.draft,
        "finish_reason": m.finish_reason,
        "stats": m.stats.as_dict() if m.stats is not None else None,
        "origins": "".join(o.code for o in m.origins),
        "segments": [[o.code if o is not None else "", text] for o, text in m.segments],
    }


# Import


def from_archive(data: Any) -> list[tuple[Conversation, list[StoredMessage]]]:
    """Checks an archive and reads it back.

    Each conversation comes with its messages ordered parents first; ids are
    the archive's own.

    Raises:
        ValueError: The first problem found, in one line.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError("not a Tandem conversations file")
    version = data.get("version")
    if type(version) is not int or version != VERSION:
        raise ValueError(f"unsupported version {version!r} (expected {VERSION})")
    items = data.get("conversations")
    if not isinstance(items, list):
        raise ValueError("'conversations' must be a list")
    return [_read_conversation(item, f"conversation {i + 1}") for i, item in enumerate(items)]


def _read_conversation(item: Any, where: str) -> tuple[Conversation, list[StoredMessage]]:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: not an object")
    now = time.time()
    title = _get(item, "title", str, where)
    system_prompt = _get(item, "system_prompt", str, where, optional=True)
    created_at = _time(item, "created_at", where, now)
    updated_at = _time(item, "updated_at", where, now)
    head_id = _get(item, "head_id", int, where, optional=True)
    raw = item.get("messages")
    if not isinstance(raw, list):
        raise ValueError(f"{where}: 'messages' must be a list")
    messages = [_read_message(m, f"{where}, message {i + 1}", now) for i, m in enumerate(raw)]
    ids = {m.id for m in messages}
    if len(ids) != len(messages):
        raise ValueError(f"{where}: two messages share an id")
    for m in messages:
        if m.parent_id is not None and m.parent_id not in ids:
            raise ValueError(f"{where}: message {m.id} has an unknown parent {m.parent_id}")
    if (head_id is None) != (not messages) or (head_id is not None and head_id not in ids):
        raise ValueError(f"{where}: 'head_id' must name one of its messages")
    conversation = Conversation(0, title, created_at, updated_at, system_prompt or None, head_id)
    return conversation, _parents_first(messages, where)


def _parents_first(messages: list[StoredMessage], where: str) -> list[StoredMessage]:
    """The messages with each parent before its children, siblings by id."""
    children: dict[int | None, list[StoredMessage]] = {}
    for m in messages:
        children.setdefault(m.parent_id, []).append(m)
    ready = [(m.id, m) for m in children.get(None, [])]
    heapq.heapify(ready)
    ordered: list[StoredMessage] = []
    while ready:
        _, m = heapq.heappop(ready)
        ordered.append(m)
        for child in children.get(m.id, []):
            heapq.heappush(ready, (child.id, child))
    if len(ordered) != len(messages):  # the rest never reach a root
        raise ValueError(f"{where}: messages form a cycle")
    return ordered


def _read_message(item: Any, where: str, now: float) -> StoredMessage:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: not an object")
    role = _get(item, "role", str, where)
    if role not in _ROLES:
        raise ValueError(f"{where}: 'role' must be system, user or assistant")
    if "parent_id" not in item:
        raise ValueError(f"{where}: 'parent_id' is missing")
    return StoredMessage(
        id=_get(item, "id", int, where),
        conversation_id=0,
        role=role,
        content=_get(item, "content", str, where),
        created_at=_time(item, "created_at", where, now),
        target=_get(item, "target", str, where, optional=True),
        draft=_get(item, "draft", str, where, optional=True),
        finish_reason=_get(item, "finish_reason", str, where, optional=True),
        stats=_read_stats(item.get("stats"), where),
        origins=_read_origins(item.get("origins"), where),
        segments=_read_segments(item.get("segments"), where),
        parent_id=_get(item, "parent_id", int, where, optional=True),
    )


def _get(item: dict[str, Any], key: str, kind: type, where: str, optional: bool = False) -> Any:
    """``item[key]`` when it has the type ``kind`` (or is missing or null, if optional)."""
    value = item.get(key)
    if value is None and optional:
        return None
    # bool is an int to Python, never to the archive.
    if not isinstance(value, kind) or isinstance(value, bool):
        article = "an" if kind.__name__[0] in "aeiou" else "a"
        raise ValueError(f"{where}: {key!r} must be {article} {kind.__name__}")
    return value


def _time(item: dict[str, Any], key: str, where: str, default: float) -> float:
    value = item.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: {key!r} must be a number")
    return float(value)


def _read_stats(value: Any, where: str) -> Stats | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: 'stats' must be an object")
    clean: dict[str, Any] = {}
    for f in fields(Stats):
        if f.name not in value:
            continue
        v = value[f.name]
        # The annotations are strings here, such as "int", "float | None" or "bool".
        kind = str(f.type)
        if kind == "bool":
            ok = isinstance(v, bool)
        elif kind.startswith("str"):
            ok = isinstance(v, str) or (v is None and "None" in kind)
        else:
            ok = (v is None and "None" in kind) or (
                not isinstance(v, bool)
                and isinstance(v, int if kind.startswith("int") else int | float)
            )
        if not ok:
            raise ValueError(f"{where}: stats {f.name!r} has a wrong type")
        clean[f.name] = v
    return Stats(**clean)


def _read_origins(value: Any, where: str) -> tuple[Origin, ...]:
    if value is None:
        return ()
    if not isinstance(value, str):
        raise ValueError(f"{where}: 'origins' must be a string")
    if any(c not in _CODES for c in value):
        raise ValueError(f"{where}: 'origins' has an unknown code")
    return tuple(Origin.from_code(c) for c in value)


def _read_segments(value: Any, where: str) -> tuple[Segment, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError(f"{where}: 'segments' must be a list")
    segments: list[Segment] = []
    for pair in value:
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(p, str) for p in pair)
        ):
            raise ValueError(f"{where}: each segment must be [origin code, text]")
        code, text = pair
        if code and (len(code) != 1 or code not in _CODES):
            raise ValueError(f"{where}: a segment has an unknown origin code")
        segments.append((Origin.from_code(code) if code else None, text))
    return tuple(segments)
