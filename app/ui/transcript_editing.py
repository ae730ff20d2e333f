"""Editing a transcript message in place, and keeping the edits of messages not on show.

:class:`InPlaceEdit` lays a :class:`MessageEditor` over a message of the view
and makes room under the message when the editor is taller than it. An edit
left unsaved when the view shows other messages is kept as a draft and comes
back with its message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from PySide6.QtCore import QObject, QSizeF, Signal, Slot
from PySide6.QtGui import QTextBlock, QTextCursor
from PySide6.QtWidgets import QTextEdit

from app.store import StoredMessage
from app.ui.message_editor import MessageEditor


class InPlaceEdit(QObject):
    """The editor over the message being edited in a transcript view.

    Signals:
        submitted: The edited message's id and the text as typed.
        cancelled: The edited message's id; its draft is dropped.

    Args:
        view: The view the editor lies over.
        spans: The view's message id to (start, end) document positions; the
            view keeps it up to date.
    """

    submitted = Signal(int, str)
    cancelled = Signal(int)

    def __init__(self, view: QTextEdit, spans: Mapping[int, tuple[int, int]]) -> None:
        super().__init__(view)
        self._view = view
        self._spans = spans
        self.message_id: int | None = None  # the message edited in place
        self._base = ""  # the text the edit started from
        # Unsaved edits of messages not shown now: they come back with the message.
        self._drafts: dict[int, str] = {}
        self._reserved = 0.0  # room added under it for a taller editor
        self._placing = False
        self.editor = MessageEditor(view.viewport())
        self.editor.hide()
        self.editor.submitted.connect(self._on_submitted)
        self.editor.cancelled.connect(self._on_cancelled)
        self.editor.height_changed.connect(self._on_height_changed)
        view.verticalScrollBar().valueChanged.connect(self._on_value_changed)
        layout = view.document().documentLayout()
        layout.documentSizeChanged.connect(self._on_document_size_changed)

    def begin(self, message_id: int, text: str) -> bool:
        """Lays the editor, prefilled with ``text`` or the message's draft, over it.

        Returns:
            Whether the message is shown (else nothing changes).
        """
        if message_id not in self._spans:
            return False
        self.end()
        self.message_id, self._base = message_id, text
        self.editor.start(self._drafts.pop(message_id, text))
        self.editor.show()
        self.place()
        self.editor.field.setFocus()
        return True

    def end(self) -> None:
        """Takes the editor away and gives back the room it took."""
        if self.message_id is None:
            return
        self._placing = True  # giving the room back must not place the editor again
        try:
            self._reserve(0.0)
        finally:
            self._placing = False
        self.message_id = None
        self.editor.hide()

    def set_aside(self) -> None:
        """Ends the edit before the view is redone, keeping its text if it changed."""
        if self.message_id is not None and self.editor.text() != self._base:
            self._drafts[self.message_id] = self.editor.text()
        self.end()

    def bring_back(self, messages: Sequence[StoredMessage]) -> None:
        """Once ``messages`` are shown, edits the first of them that has a draft."""
        for m in messages:  # a draft the message now says was saved
            if self._drafts.get(m.id) == m.content:
                del self._drafts[m.id]
        unsaved = next((m for m in messages if m.id in self._drafts), None)
        if unsaved is not None:
            self.begin(unsaved.id, unsaved.content)

    def place(self) -> None:
        """Lays the editor over the edited message's text and footer."""
        blocks = self._message_blocks()
        if blocks is None or self._placing:
            return
        self._placing = True  # making room relays the document, which asks again
        try:
            self._lay_editor(blocks)
        finally:
            self._placing = False

    @Slot(str)
    def _on_submitted(self, text: str) -> None:
        if self.message_id is not None:
            self.submitted.emit(self.message_id, text)

    @Slot()
    def _on_cancelled(self) -> None:
        message_id = self.message_id
        self.end()
        if message_id is not None:
            self._drafts.pop(message_id, None)
            self.cancelled.emit(message_id)

    @Slot()
    def _on_height_changed(self) -> None:
        self.place()

    @Slot(int)
    def _on_value_changed(self, _value: int) -> None:
        self.place()

    @Slot(QSizeF)
    def _on_document_size_changed(self, _size: QSizeF) -> None:
        self.place()

    def _message_blocks(self) -> tuple[QTextBlock, QTextBlock] | None:
        """The body block and the last block of the message being edited."""
        span = self._spans.get(self.message_id) if self.message_id is not None else None
        if span is None:
            return None
        doc = self._view.document()
        return doc.findBlock(span[0]).next(), doc.findBlock(span[1])

    def _reserve(self, room: float) -> None:
        """Adds ``room`` below the edited message, so the editor hides none of the next."""
        blocks = self._message_blocks()
        if blocks is None or room == self._reserved:
            return
        last = blocks[1]
        fmt = last.blockFormat()
        fmt.setBottomMargin(max(fmt.bottomMargin() - self._reserved + room, 0.0))
        self._reserved = room
        QTextCursor(last).setBlockFormat(fmt)

    def _lay_editor(self, blocks: tuple[QTextBlock, QTextBlock]) -> None:
        view = self._view
        layout = view.document().documentLayout()
        body, last = (layout.blockBoundingRect(b) for b in blocks)
        # Block rectangles leave out margins: the room made below does not count.
        shown = last.bottom() - body.top()
        wanted = self.editor.wanted_height()
        self._reserve(max(wanted - shown, 0.0))
        left = int(body.left()) - view.horizontalScrollBar().value()
        top = int(body.top()) - view.verticalScrollBar().value()
        width = view.viewport().width() - 2 * max(int(body.left()), 0)
        self.editor.setGeometry(left, top, width, max(wanted, int(shown)))
