"""A thin Qt list model over the store's conversations."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt

from app.store import Conversation, Store

ConversationIdRole = Qt.ItemDataRole.UserRole + 1


class ConversationListModel(QAbstractListModel):
    """Conversations, most recently used first."""

    def __init__(self, store: Store, parent: Any = None) -> None:
        super().__init__(parent)
        self._store = store
        self._query = ""
        self._snippets: dict[int, str] = {}
        self._hits: dict[int, int] = {}  # conversation id: its best hit's message id
        self._items: list[Conversation] = store.conversations()

    def refresh(self) -> None:
        self.beginResetModel()
        if self._query:
            # Full-text search: the chats with a match, each with its best snippet.
            self._snippets, self._hits = {}, {}
            for hit in self._store.search(self._query):
                self._snippets.setdefault(hit.conversation_id, hit.snippet)
                self._hits.setdefault(hit.conversation_id, hit.message_id)
            by_id = {c.id: c for c in self._store.conversations()}
            self._items = [by_id[i] for i in self._snippets if i in by_id]
        else:
            self._snippets, self._hits = {}, {}
            self._items = self._store.conversations()
        self.endResetModel()

    def set_search(self, query: str) -> None:
        """Shows only the chats whose messages match ``query``; empty shows all."""
        self._query = query.strip()
        self.refresh()

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._items)

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = 0) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._items):
            return None
        item = self._items[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            snippet = self._snippets.get(item.id)
            return f"{item.title}\n{snippet}" if snippet else item.title
        if role == Qt.ItemDataRole.ToolTipRole:
            return item.title
        if role == ConversationIdRole:
            return item.id
        return None

    def row_of(self, conversation_id: int) -> int:
        """Row of a conversation, or -1."""
        return next((i for i, c in enumerate(self._items) if c.id == conversation_id), -1)

    def hit_at(self, row: int) -> int | None:
        """The message whose snippet the row shows while searching, else ``None``."""
        item = self.conversation_at(row)
        return self._hits.get(item.id) if item is not None else None

    def conversation_at(self, row: int) -> Conversation | None:
        return self._items[row] if 0 <= row < len(self._items) else None
