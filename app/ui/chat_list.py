"""The chat list with its search field and New / Delete buttons."""

from __future__ import annotations

from PySide6.QtCore import QItemSelectionModel, QModelIndex, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QHBoxLayout, QLineEdit, QListView, QPushButton, QVBoxLayout, QWidget

from app.services import StoreEvents
from app.store import Store, StoreChange
from app.ui.conversation_model import ConversationIdRole, ConversationListModel
from app.ui.empty_hint import HintListView
from app.ui.shortcuts import shortcut_text

SEARCH_PAUSE_MS = 150  # the search runs once typing pauses this long


def empty_hint(query: str) -> str:
    """What the empty list says: how to start a chat, or that ``query`` matched none."""
    if query:
        return f"No chats match “{query}”"
    return f"No conversations yet — press {shortcut_text(QKeySequence.StandardKey.New)}"


class ChatList(QWidget):
    """Conversations, most recently used first, searched in full text.

    It follows the store: after each write the list is read again and the chat
    that was selected stays selected.

    Signals:
        conversation_selected: The id of the chat the user picked.
        search_hit_selected: The chat and message of the search hit the user
            picked; sent in place of ``conversation_selected`` while searching.
        new_requested: New Chat was pressed.
        delete_requested: Delete was pressed.
    """

    conversation_selected = Signal(int)
    search_hit_selected = Signal(int, int)
    new_requested = Signal()
    delete_requested = Signal()

    def __init__(self, store: Store, events: StoreEvents, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.conversations = ConversationListModel(store, self)
        self.conversation_list = HintListView()
        self.conversation_list.setModel(self.conversations)
        self.conversation_list.set_empty_hint(empty_hint(""))
        self.conversation_list.setAccessibleName("Conversations")
        self.conversation_list.setEditTriggers(QListView.EditTrigger.NoEditTriggers)
        # Long titles end in "…" rather than scrolling sideways.
        self.conversation_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conversation_list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.conversation_list.setContextMenuPolicy(Qt.ContextMenuPolicy.ActionsContextMenu)
        self.new_button = QPushButton("New Chat")
        self.new_button.setAccessibleName("New conversation")
        self.delete_button = QPushButton("Delete")
        self.delete_button.setAccessibleName("Delete conversation")
        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search all chats")
        self.search_edit.setAccessibleName("Search all chats")
        self.search_edit.setClearButtonEnabled(True)
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_PAUSE_MS)
        self._refreshing = False  # reselecting after a store write: no hit is opened again

        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 0, 6)
        buttons = QHBoxLayout()
        buttons.addWidget(self.new_button)
        buttons.addWidget(self.delete_button)
        layout.addLayout(buttons)
        layout.addWidget(self.search_edit)
        layout.addWidget(self.conversation_list, 1)

        self._search_timer.timeout.connect(self._on_search_timeout)
        self.search_edit.textChanged.connect(self._on_search_text_changed)
        self.new_button.clicked.connect(self.new_requested)
        self.delete_button.clicked.connect(self.delete_requested)
        self.conversation_list.selectionModel().currentChanged.connect(self._on_current_changed)
        events.changed.connect(self._on_store_changed)

    def add_actions(self, actions: list[QAction]) -> None:
        """Puts ``actions`` in the list's context menu."""
        for action in actions:
            self.conversation_list.addAction(action)

    def current_id(self) -> int | None:
        """The selected chat's id, or ``None``."""
        index = self.conversation_list.selectionModel().currentIndex()
        cid = index.data(ConversationIdRole) if index.isValid() else None
        return cid if isinstance(cid, int) else None

    def select(self, conversation_id: int) -> None:
        """Selects a chat; one that is not listed (filtered out) clears the selection."""
        self.select_row(self.conversations.row_of(conversation_id))

    def select_row(self, row: int) -> None:
        """Selects the chat in ``row`` (0 is the most recently used)."""
        index = self.conversations.index(row, 0)
        self.conversation_list.selectionModel().setCurrentIndex(
            index, QItemSelectionModel.SelectionFlag.ClearAndSelect
        )

    def clear_selection(self) -> None:
        """Selects no chat."""
        self.conversation_list.clearSelection()
        self.conversation_list.selectionModel().clearCurrentIndex()

    def is_empty(self) -> bool:
        """Whether no chat is listed."""
        return self.conversations.rowCount() == 0

    def focus_search(self) -> None:
        """Puts the cursor in the search field, its text selected (⌘F)."""
        self.search_edit.setFocus()
        self.search_edit.selectAll()

    @Slot(object)
    def _on_store_changed(self, _change: StoreChange) -> None:
        current = self.current_id()
        self.conversations.refresh()
        if current is not None and self.conversations.row_of(current) >= 0:
            self._refreshing = True
            try:
                self.select(current)  # the same chat, wherever it moved
            finally:
                self._refreshing = False

    @Slot(QModelIndex, QModelIndex)
    def _on_current_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        cid = current.data(ConversationIdRole) if current.isValid() else None
        if not isinstance(cid, int):
            return
        hit = None if self._refreshing else self.conversations.hit_at(current.row())
        if hit is not None:
            self.search_hit_selected.emit(cid, hit)
        else:
            self.conversation_selected.emit(cid)

    @Slot(str)
    def _on_search_text_changed(self, _text: str) -> None:
        self._search_timer.start()

    @Slot()
    def _on_search_timeout(self) -> None:
        query = self.search_edit.text().strip()
        self.conversations.set_search(query)
        self.conversation_list.set_empty_hint(empty_hint(query))
