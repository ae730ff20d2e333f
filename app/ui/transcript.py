"""The transcript: messages of one conversation, with the reply streaming in.

Streaming appends at the end of the document; nothing already shown is re-rendered.
Reply text can be coloured by the origin of its tokens: accepted draft tokens,
tokens of prompt lookup, the target's corrections and its bonus tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QUrl, Signal, Slot
from PySide6.QtGui import QColor, QFont, QTextBlockFormat, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QTextBrowser, QWidget

from app.engine.types import Origin, Segment
from app.store import StoredMessage

_ROLE_LABELS = {"user": "You", "assistant": "Tandem", "system": "System"}

# Translucent backgrounds keep the text's own colour, so they read in light and dark mode.
ORIGIN_COLORS: dict[Origin, QColor] = {
    Origin.DRAFT: QColor(34, 197, 94, 70),
    Origin.LOOKUP: QColor(14, 165, 233, 70),
    Origin.CORRECTION: QColor(249, 115, 22, 90),
    Origin.BONUS: QColor(168, 85, 247, 70),
}
ORIGIN_LABELS: dict[Origin, str] = {
    Origin.DRAFT: "accepted draft",
    Origin.LOOKUP: "prompt lookup",
    Origin.CORRECTION: "target correction",
    Origin.BONUS: "bonus token",
}
STATS_SCHEME = "stats"


def origin_format(origin: Origin | None, colour: bool) -> QTextCharFormat:
    """The character format of a token of ``origin``."""
    fmt = QTextCharFormat()
    if colour and origin in ORIGIN_COLORS:
        assert origin is not None
        fmt.setBackground(ORIGIN_COLORS[origin])
        fmt.setToolTip(ORIGIN_LABELS[origin])
    return fmt


class TranscriptView(QTextBrowser):
    """Read-only view of a conversation."""

    stats_requested = Signal(int)  # message id

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("transcript")
        self.setAccessibleName("Transcript")
        self.setOpenExternalLinks(False)
        self.setOpenLinks(False)
        self.setPlaceholderText("Start a conversation: type a message below.")
        self._streaming = False
        self.colour = True
        self.anchorClicked.connect(self._on_anchor_clicked)

    def show_messages(self, messages: list[StoredMessage]) -> None:
        """Replaces the view with ``messages``."""
        self.clear()
        self._streaming = False
        for m in messages:
            segments = m.segments if m.role == "assistant" else ()
            stats_id = m.id if m.role == "assistant" and m.stats is not None else None
            self._append_block(m.role, m.content, _note(m), segments, stats_id)

    def append_segments(self, segments: Sequence[Segment]) -> None:
        """Appends streamed reply text, each run in its origin's colour."""
        if not segments:
            return
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        for origin, text in segments:
            cursor.insertText(text, origin_format(origin, self.colour))
        if at_bottom:
            bar.setValue(bar.maximum())

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

    def end_reply(self, note: str = "", stats_id: int | None = None) -> None:
        if note or stats_id is not None:
            self._append_note(note, stats_id)
        self._streaming = False

    @Slot(QUrl)
    def _on_anchor_clicked(self, url: QUrl) -> None:
        if url.scheme() == STATS_SCHEME and url.path().isdigit():
            self.stats_requested.emit(int(url.path()))

    def _append_block(
        self,
        role: str,
        content: str,
        note: str = "",
        segments: Sequence[Segment] = (),
        stats_id: int | None = None,
    ) -> None:
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
        if segments and "".join(t for _, t in segments) == content:
            for origin, text in segments:
                cursor.insertText(text, origin_format(origin, self.colour))
        else:
            cursor.insertText(content, QTextCharFormat())
        self.setTextCursor(cursor)
        if note or stats_id is not None:
            self._append_note(note, stats_id)
        self.ensureCursorVisible()

    def _append_note(self, note: str, stats_id: int | None = None) -> None:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        fmt = QTextCharFormat()
        fmt.setFontItalic(True)
        fmt.setForeground(self.palette().placeholderText())
        cursor.insertBlock(QTextBlockFormat(), fmt)
        if note:
            cursor.insertText(note + ("  " if stats_id is not None else ""), fmt)
        if stats_id is not None:
            link = QTextCharFormat(fmt)
            link.setAnchor(True)
            link.setAnchorHref(f"{STATS_SCHEME}:{stats_id}")
            link.setForeground(self.palette().link())
            link.setToolTip("Show this reply's statistics")
            cursor.insertText("Stats…", link)


def _note(m: StoredMessage) -> str:
    if m.role != "assistant":
        return ""
    return {"cancelled": "Stopped.", "error": "Interrupted by an error."}.get(
        m.finish_reason or "", ""
    )
