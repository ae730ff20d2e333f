"""What the user does to chats and messages: rename, duplicate, system prompt,
export and import, delete; copy, edit on a new branch, regenerate, switch branches."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtGui import QCursor
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QInputDialog,
    QMessageBox,
    QPlainTextEdit,
    QWidget,
)

from app.errors import first_line
from app.services import ChatController, EngineService
from app.store import Store
from app.store.reasoning import answer_of
from app.ui.chat_list import ChatList
from app.ui.pair_loading import LOAD_FIRST
from app.ui.stats_popover import StatsPopover
from app.ui.transcript import TranscriptView


@dataclass(frozen=True)
class ChatHost:
    """What the actions ask of the window they serve, and the one thing they tell it.

    Attributes:
        conversation_id: The chat on show, or ``None``.
        pair_loaded: Whether a model pair is loaded, so a reply can start.
        show_error: Shows one line of trouble in the window.
        start_reply: Asks for the chat's next reply, after ``parent_id`` if given.
        show_status: Shows a passing message in the status bar for so many ms.
        forget_conversation: The chat on show was deleted: nothing is on show.
    """

    conversation_id: Callable[[], int | None]
    pair_loaded: Callable[[], bool]
    show_error: Callable[[str], None]
    start_reply: Callable[[int, int | None], None]
    show_status: Callable[[str, int], None]
    forget_conversation: Callable[[], None]


class ChatActions(QObject):
    """The chat and message actions of the File menu, the chat list and the transcript."""

    def __init__(
        self,
        store: Store,
        chat: ChatController,
        service: EngineService,
        transcript: TranscriptView,
        chats: ChatList,
        host: ChatHost,
        parent: QWidget,
    ) -> None:
        """Acts on ``store`` for the window ``parent``, which also owns its dialogs.

        Args:
            store: Where the chats live.
            chat: The window's reply, cancelled or asked whether one streams.
            service: The engine, asked whether it is busy.
            transcript: The chat on show, for editing a message in place.
            chats: The chat list, to select the chat an action made.
            host: What the actions ask of the window.
            parent: The window: the actions' owner and their dialogs' parent.
        """
        super().__init__(parent)
        self._store = store
        self._chat = chat
        self._service = service
        self._transcript = transcript
        self._chats = chats
        self._host = host
        self._dialogs = parent
        self._prompt_conversation = 0  # the chat whose System Prompt dialog is open
        chats.delete_requested.connect(self._on_delete_conversation_requested)
        transcript.stats_requested.connect(self._on_stats_requested)
        transcript.copy_requested.connect(self._on_copy_requested)
        transcript.edit_requested.connect(self._on_edit_requested)
        transcript.edit_submitted.connect(self._on_edit_submitted)
        transcript.regenerate_requested.connect(self._on_regenerate_requested)
        transcript.delete_requested.connect(self._on_delete_message_requested)
        transcript.branch_requested.connect(self._on_branch_requested)

    @Slot()
    def _on_delete_conversation_requested(self) -> None:
        cid = self._host.conversation_id()
        conversation = self._store.conversation(cid) if cid is not None else None
        if conversation is None or cid is None:
            return
        answer = QMessageBox.question(
            self._dialogs,
            "Delete Conversation",
            f"Delete “{conversation.title}”? This cannot be undone.",
            QMessageBox.StandardButton.Cancel | QMessageBox.StandardButton.Yes,
            QMessageBox.StandardButton.Cancel,
        )
        if answer != QMessageBox.StandardButton.Yes:
            return
        reply = self._chat.reply
        if reply is not None and reply.conversation_id == cid:
            self._chat.cancel()  # it ends unsaved: its chat is gone
        self._store.delete_conversation(cid)
        self._host.forget_conversation()
        if not self._chats.is_empty():
            self._chats.select_row(0)
        else:
            self._transcript.show_messages([])

    def _conversation_actions_allowed(self) -> bool:
        if self._chat.busy or self._service.calibrating:
            self._host.show_status("Wait for the reply to finish, or stop it.", 5_000)
            return False
        return True

    @Slot()
    def _on_rename_conversation_requested(self) -> None:
        cid = self._host.conversation_id()
        conversation = self._store.conversation(cid) if cid is not None else None
        if conversation is None:
            return
        title, ok = QInputDialog.getText(
            self._dialogs, "Rename Chat", "Title:", text=conversation.title
        )
        if ok and title.strip():
            self._store.rename_conversation(conversation.id, title.strip())

    @Slot()
    def _on_duplicate_conversation_requested(self) -> None:
        cid = self._host.conversation_id()
        if cid is None:
            return
        copy = self._store.duplicate_conversation(cid)
        self._chats.select(copy.id)

    @Slot()
    def _on_system_prompt_requested(self) -> None:
        cid = self._host.conversation_id()
        if cid is None:
            cid = self._store.create_conversation("New chat").id
            self._chats.select(cid)
        conversation = self._store.conversation(cid)
        assert conversation is not None
        # Not getMultiLineText: its editor never wraps, so long instructions ran off the side.
        dialog = QInputDialog(self._dialogs)
        dialog.setWindowTitle("System Prompt")
        dialog.setLabelText("Instructions the model follows for this whole chat:")
        dialog.setOption(QInputDialog.InputDialogOption.UsePlainTextEditForTextInput)
        dialog.setTextValue(conversation.system_prompt or "")
        editor = dialog.findChild(QPlainTextEdit)
        assert editor is not None
        editor.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self._prompt_conversation = cid
        dialog.textValueSelected.connect(self._on_text_value_selected)
        dialog.open()

    @Slot(str)
    def _on_text_value_selected(self, text: str) -> None:
        """The System Prompt dialog was accepted."""
        self._store.set_system_prompt(self._prompt_conversation, text.strip() or None)

    @Slot()
    def _on_export_conversation_requested(self) -> None:
        cid = self._host.conversation_id()
        conversation = self._store.conversation(cid) if cid is not None else None
        if conversation is None:
            return
        safe = "".join(c if c.isalnum() or c in " -_" else "_" for c in conversation.title)
        path, chosen = QFileDialog.getSaveFileName(
            self._dialogs,
            "Export Chat",
            f"{safe.strip() or 'chat'}.md",
            "Markdown (*.md);;Tandem JSON (*.json)",
        )
        if path:
            self.export_conversations(Path(path), [conversation.id], as_json="JSON" in chosen)

    @Slot()
    def _on_export_all_requested(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self._dialogs, "Export All Chats", "Tandem chats.json", "Tandem JSON (*.json)"
        )
        if path:
            self.export_conversations(Path(path), None, as_json=True)

    def export_conversations(self, path: Path, ids: list[int] | None, as_json: bool) -> bool:
        """Writes chats to ``path`` as JSON (all branches) or Markdown (the branch shown)."""
        from app.files import write_atomic

        try:
            if as_json or ids is None or path.suffix.lower() == ".json":
                data = json.dumps(self._store.export_json(ids), indent=2, ensure_ascii=False)
            else:
                data = self._store.export_markdown(ids[0])
            write_atomic(path, data.encode("utf-8"))
        except OSError as exc:
            self._host.show_error(f"Could not export to {path.name}: {exc.strerror or exc}")
            return False
        self._host.show_status(f"Exported to {path.name}.", 5_000)
        return True

    @Slot()
    def _on_import_requested(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self._dialogs, "Import Chats", "", "Tandem JSON (*.json)"
        )
        if path:
            self.import_conversations(Path(path))

    def import_conversations(self, path: Path) -> list[int]:
        """Adds the chats of a Tandem JSON export; a bad file changes nothing."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            ids = self._store.import_json(data)
        except (OSError, ValueError) as exc:
            self._host.show_error(f"Could not import {path.name}: {first_line(exc)}")
            return []
        if ids:
            self._chats.select(ids[0])
        self._host.show_status(f"Imported {len(ids)} chat(s) from {path.name}.", 5_000)
        return ids

    # Messages

    @Slot(int)
    def _on_copy_requested(self, message_id: int) -> None:
        m = self._store.message(message_id)
        if m is not None:
            said = answer_of(m.content) if m.role == "assistant" else m.content
            QApplication.clipboard().setText(said)
            self._host.show_status("Message copied.", 3_000)

    @Slot(int)
    def _on_edit_requested(self, message_id: int) -> None:
        m = self._store.message(message_id)
        if m is None or m.role != "user" or not self._conversation_actions_allowed():
            return
        if not self._host.pair_loaded():
            self._host.show_error(LOAD_FIRST)
            return
        self._transcript.begin_edit(message_id, m.content)

    @Slot(int, str)
    def _on_edit_submitted(self, message_id: int, text: str) -> None:
        m = self._store.message(message_id)
        if m is None or m.role != "user" or not self._conversation_actions_allowed():
            return  # the editor stays: the text is kept until the reply ends
        if not self._host.pair_loaded():
            self._host.show_error(LOAD_FIRST)
            return
        if not text.strip() or text.strip() == m.content:
            return
        self._transcript.end_edit()
        # The edit starts a branch beside the original; both stay reachable.
        self._store.add_message(m.conversation_id, "user", text.strip(), parent_id=m.parent_id)
        self._host.start_reply(m.conversation_id, None)

    @Slot(int)
    def _on_regenerate_requested(self, message_id: int) -> None:
        m = self._store.message(message_id)
        if m is None or m.role != "assistant" or not self._conversation_actions_allowed():
            return
        if not self._host.pair_loaded() or m.parent_id is None:
            self._host.show_error(LOAD_FIRST)
            return
        self._host.start_reply(m.conversation_id, m.parent_id)

    @Slot(int)
    def _on_delete_message_requested(self, message_id: int) -> None:
        m = self._store.message(message_id)
        if m is None or not self._conversation_actions_allowed():
            return
        answer = QMessageBox.question(
            self._dialogs,
            "Delete Message",
            "Delete this message and everything after it in this branch?",
            QMessageBox.StandardButton.Cancel | QMessageBox.StandardButton.Yes,
            QMessageBox.StandardButton.Cancel,
        )
        if answer == QMessageBox.StandardButton.Yes:
            self._store.delete_message(message_id)  # the chat on show follows the store

    @Slot(int, int)
    def _on_branch_requested(self, message_id: int, delta: int) -> None:
        if not self._conversation_actions_allowed():
            return
        siblings = self._store.siblings(message_id)
        if message_id not in siblings:
            return
        target = siblings[(siblings.index(message_id) + delta) % len(siblings)]
        self._store.switch_branch(target)  # the chat on show follows the store

    @Slot(int)
    def _on_stats_requested(self, message_id: int) -> StatsPopover | None:
        m = self._store.message(message_id)
        if m is None or m.stats is None:
            return None
        popover = StatsPopover(m.stats, m.target, m.draft, self._dialogs)
        popover.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        popover.show_at(QCursor.pos())
        return popover
