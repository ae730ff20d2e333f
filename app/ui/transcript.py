"""The transcript: messages of one conversation, with the reply streaming in.

Streaming appends at the end of the document; nothing already shown is re-rendered.
"""

from __future__ import annotations

from PySide6.QtGui import QFont, QTextBlockFormat, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QTextBrowser, QWidget

from app.store import StoredMessage

_ROLE_LABELS = {"user": "You", "assistant": "Tandem", "system": "System"}


class TranscriptView(QTextBrowser):
    """Read-only view of a conversation."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("transcript")
        self.setAccessibleName("Transcript")
        self.setOpenExternalLinks(False)
        self.setPlaceholderText("Start a conversation: type a message below.")
        self._streaming = False

    def show_messages(self, messages: list[StoredMessage]) -> None:
        """Replaces the view with ``messages``."""
        self.clear()
        self._streaming = False
        for m in messages:
            self._append_block(m.role, m.content, note=_note(m))

    def append_message(self, role: str, content: str) -> None:
        self._append_block(role, content)

    def begin_reply(self) -> None:
        """Adds an empty assistant block that :meth:`append_text` fills."""
        self._append_block("assistant", "")
        self._streaming = True

    def append_text(self, text: str) -> None:
        if not text:
            return
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text, QTextCharFormat())
        if at_bottom:
            bar.setValue(bar.maximum())

    def end_reply(self, note: str = "") -> None:
        if note:
            self._append_note(note)
        self._streaming = False

    def _append_block(self, role: str, content: str, note: str = "") -> None:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        if not self.document().isEmpty():
            cursor.insertBlock()
        header = QTextBlockFormat()
        header.setTopMargin(10)
        bold = QTextCharFormat()
        bold.setFontWeight(QFont.Weight.Bold)
        cursor.setBlockFormat(header)
        cursor.insertText(_ROLE_LABELS.get(role, role), bold)
        cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        cursor.insertText(content, QTextCharFormat())
        self.setTextCursor(cursor)
        if note:
            self._append_note(note)
        self.ensureCursorVisible()

    def _append_note(self, note: str) -> None:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        fmt = QTextCharFormat()
        fmt.setFontItalic(True)
        fmt.setForeground(self.palette().placeholderText())
        cursor.insertBlock(QTextBlockFormat(), fmt)
        cursor.insertText(note, fmt)


def _note(m: StoredMessage) -> str:
    if m.role != "assistant":
        return ""
    return {"cancelled": "Stopped.", "error": "Interrupted by an error."}.get(
        m.finish_reason or "", ""
    )
