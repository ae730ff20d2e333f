"""What the user does to chats and messages: rename, duplicate, system prompt,
export and import, delete; copy, edit on a new branch, regenerate, switch branches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Slot
from PySide6.QtGui import QCursor
from PySide6.QtWidgets import QApplication, QFileDialog, QInputDialog, QMessageBox

from app.errors import first_line
from app.ui.pair_loading import LOAD_FIRST
from app.ui.stats_popover import StatsPopover

if TYPE_CHECKING:
    from PySide6.QtWidgets import QMainWindow

    from app.services import ChatController, EngineService, PairInfo
    from app.store import Store
    from app.ui.chat_list import ChatList
    from app.ui.transcript import TranscriptView

    _Window = QMainWindow
else:
    _Window = object


class ChatActionsMixin(_Window):
    """The main window's chat and message actions (File menu, list and transcript links)."""

    if TYPE_CHECKING:
        store: Store
        service: EngineService
        chat: ChatController
        chats: ChatList
        transcript: TranscriptView
        _conversation_id: int | None
        _pair: PairInfo | None

        def show_error(self, message: str) -> None: ...
        def _start_reply(self, cid: int, parent_id: int | None = None) -> None: ...

    @Slot()
    def _on_delete_conversation_requested(self) -> None:
        cid = self._conversation_id
        conversation = self.store.conversation(cid) if cid is not None else None
        if conversation is None or cid is None:
            return
        answer = QMessageBox.question(
            self,
            "Delete Conversation",
            f"Delete “{conversation.title}”? This cannot be undone.",
            QMessageBox.StandardButton.Cancel | QMessageBox.StandardButton.Yes,
            QMessageBox.StandardButton.Cancel,
        )
        if answer != QMessageBox.StandardButton.Yes:
            return
        reply = self.chat.reply
        if reply is not None and reply.conversation_id == cid:
            self.chat.cancel()  # it ends unsaved: its chat is gone
        self.store.delete_conversation(cid)
        self._conversation_id = None
        if not self.chats.is_empty():
            self.chats.select_row(0)
        else:
            self.transcript.show_messages([])

    def _conversation_actions_allowed(self) -> bool:
        if self.chat.busy or self.service.busy:
            self.statusBar().showMessage("Wait for the reply to finish, or stop it.", 5_000)
            return False
        return True

    @Slot()
    def _on_rename_conversation_requested(self) -> None:
        cid = self._conversation_id
        conversation = self.store.conversation(cid) if cid is not None else None
        if conversation is None:
            return
        title, ok = QInputDialog.getText(self, "Rename Chat", "Title:", text=conversation.title)
        if ok and title.strip():
            self.store.rename_conversation(conversation.id, title.strip())

    @Slot()
    def _on_duplicate_conversation_requested(self) -> None:
        if self._conversation_id is None:
            return
        copy = self.store.duplicate_conversation(self._conversation_id)
        self.chats.select(copy.id)

    @Slot()
    def _on_system_prompt_requested(self) -> None:
        cid = self._conversation_id
        if cid is None:
            cid = self.store.create_conversation("New chat").id
            self.chats.select(cid)
        conversation = self.store.conversation(cid)
        assert conversation is not None
        text, ok = QInputDialog.getMultiLineText(
            self,
            "System Prompt",
            "Instructions the model follows for this whole chat:",
            conversation.system_prompt or "",
        )
        if ok:
            self.store.set_system_prompt(cid, text.strip() or None)

    @Slot()
    def _on_export_conversation_requested(self) -> None:
        cid = self._conversation_id
        conversation = self.store.conversation(cid) if cid is not None else None
        if conversation is None:
            return
        safe = "".join(c if c.isalnum() or c in " -_" else "_" for c in conversation.title)
        path, chosen = QFileDialog.getSaveFileName(
            self,
            "Export Chat",
            f"{safe.strip() or 'chat'}.md",
            "Markdown (*.md);;Tandem JSON (*.json)",
        )
        if path:
            self.export_conversations(Path(path), [conversation.id], as_json="JSON" in chosen)

    @Slot()
    def _on_export_all_requested(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Export All Chats", "Tandem chats.json", "Tandem JSON (*.json)"
        )
        if path:
            self.export_conversations(Path(path), None, as_json=True)

    def export_conversations(self, path: Path, ids: list[int] | None, as_json: bool) -> bool:
        """Writes chats to ``path`` as JSON (all branches) or Markdown (the branch shown)."""
        from app.files import write_atomic

        try:
            if as_json or ids is None or path.suffix.lower() == ".json":
                data = json.dumps(self.store.export_json(ids), indent=2, ensure_ascii=False)
            else:
                data = self.store.export_markdown(ids[0])
            write_atomic(path, data.encode("utf-8"))
        except OSError as exc:
            self.show_error(f"Could not export to {path.name}: {exc.strerror or exc}")
            return False
        self.statusBar().showMessage(f"Exported to {path.name}.", 5_000)
        return True

    @Slot()
    def _on_import_requested(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import Chats", "", "Tandem JSON (*.json)")
        if path:
            self.import_conversations(Path(path))

    def import_conversations(self, path: Path) -> list[int]:
        """Adds the chats of a Tandem JSON export; a bad file changes nothing."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            ids = self.store.import_json(data)
        except (OSError, ValueError) as exc:
            self.show_error(f"Could not import {path.name}: {first_line(exc)}")
            return []
        if ids:
            self.chats.select(ids[0])
        self.statusBar().showMessage(f"Imported {len(ids)} chat(s) from {path.name}.", 5_000)
        return ids

    # Messages

    @Slot(int)
    def _on_copy_requested(self, message_id: int) -> None:
        m = self.store.message(message_id)
        if m is not None:
            QApplication.clipboard().setText(m.content)
            self.statusBar().showMessage("Message copied.", 3_000)

    @Slot(int)
    def _on_edit_requested(self, message_id: int) -> None:
        m = self.store.message(message_id)
        if m is None or m.role != "user" or not self._conversation_actions_allowed():
            return
        if self._pair is None:
            self.show_error(LOAD_FIRST)
            return
        self.transcript.begin_edit(message_id, m.content)

    @Slot(int, str)
    def _on_edit_submitted(self, message_id: int, text: str) -> None:
        m = self.store.message(message_id)
        if m is None or m.role != "user" or not self._conversation_actions_allowed():
            return  # the editor stays: the text is kept until the reply ends
        if self._pair is None:
            self.show_error(LOAD_FIRST)
            return
        if not text.strip() or text.strip() == m.content:
            return
        self.transcript.end_edit()
        # The edit starts a branch beside the original; both stay reachable.
        self.store.add_message(m.conversation_id, "user", text.strip(), parent_id=m.parent_id)
        self._start_reply(m.conversation_id)

    @Slot(int)
    def _on_regenerate_requested(self, message_id: int) -> None:
        m = self.store.message(message_id)
        if m is None or m.role != "assistant" or not self._conversation_actions_allowed():
            return
        if self._pair is None or m.parent_id is None:
            self.show_error(LOAD_FIRST)
            return
        self._start_reply(m.conversation_id, parent_id=m.parent_id)

    @Slot(int)
    def _on_delete_message_requested(self, message_id: int) -> None:
        m = self.store.message(message_id)
        if m is None or not self._conversation_actions_allowed():
            return
        answer = QMessageBox.question(
            self,
            "Delete Message",
            "Delete this message and everything after it in this branch?",
            QMessageBox.StandardButton.Cancel | QMessageBox.StandardButton.Yes,
            QMessageBox.StandardButton.Cancel,
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.store.delete_message(message_id)  # the chat on show follows the store

    @Slot(int, int)
    def _on_branch_requested(self, message_id: int, delta: int) -> None:
        if not self._conversation_actions_allowed():
            return
        siblings = self.store.siblings(message_id)
        if message_id not in siblings:
            return
        target = siblings[(siblings.index(message_id) + delta) % len(siblings)]
        self.store.switch_branch(target)  # the chat on show follows the store

    @Slot(int)
    def _on_stats_requested(self, message_id: int) -> StatsPopover | None:
        m = self.store.message(message_id)
        if m is None or m.stats is None:
            return None
        popover = StatsPopover(m.stats, m.target, m.draft, self)
        popover.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        popover.show_at(QCursor.pos())
        return popover
