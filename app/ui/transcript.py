"""The transcript: messages of one conversation, with the reply streaming in.

Replies show as Markdown, with highlighted code blocks that copy with one click.
Reply text can be coloured by the origin of its tokens: accepted draft tokens,
tokens of prompt lookup, the target's corrections and its bonus tokens. The
colours survive rendering: the rendered text is aligned with the source text.

While a reply streams, its text is appended as it comes; each time a Markdown
block completes (a blank line, a closing code fence) only the text since the
previous one is rendered again, and :meth:`TranscriptView.end_reply` renders the
whole reply once. Nothing before the reply is ever touched.

Under each message a footer of links asks for actions on it (copy, edit,
regenerate, delete, statistics, other branches); the view only emits signals.
Edit is done in place: :meth:`TranscriptView.begin_edit` lays a wrapping editor
over the message, and the space under it grows when the editor is taller.

The view decides what shows where; :mod:`app.ui.transcript_writer` writes the
blocks of a message and :mod:`app.ui.transcript_editing` keeps the editor and
the drafts of unsaved edits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from PySide6.QtCore import QEvent, QMimeData, QPoint, QUrl, Signal, Slot
from PySide6.QtGui import (
    QGuiApplication,
    QMouseEvent,
    QPalette,
    QResizeEvent,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)
from PySide6.QtWidgets import QTextBrowser, QTextEdit, QWidget

from app.engine.types import Segment
from app.store import StoredMessage
from app.ui.markdown import COPY_SCHEME, FOLD_SCHEME
from app.ui.transcript_editing import InPlaceEdit
from app.ui.transcript_folds import fold_all, is_folded, is_folded_away, is_label, set_folded
from app.ui.transcript_style import (
    ACTION_SIGNALS,
    BRANCH_DELTAS,
    ORIGIN_COLORS,
    ORIGIN_LABELS,
    ROLE_LABELS,
    bold,
    is_chrome,
    note_of,
    origin_format,
)
from app.ui.transcript_writer import Footer, StreamedReply, TranscriptWriter

__all__ = ["ORIGIN_COLORS", "ORIGIN_LABELS", "TranscriptView", "origin_format"]


class TranscriptView(QTextBrowser):
    """Read-only view of a conversation.

    Signals carry the id of the message whose footer link was clicked;
    ``branch_requested`` also carries -1 or +1 for the previous or next branch.
    Links inside replies are never opened: ``link_clicked`` reports them.
    ``edit_submitted`` carries the id of the message being edited in place and
    the text as typed; ``edit_cancelled`` its id.
    """

    stats_requested = Signal(int)
    copy_requested = Signal(int)
    edit_requested = Signal(int)
    regenerate_requested = Signal(int)
    delete_requested = Signal(int)
    branch_requested = Signal(int, int)
    code_copied = Signal(str)
    link_clicked = Signal(QUrl)
    edit_submitted = Signal(int, str)
    edit_cancelled = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("transcript")
        self.setAccessibleName("Transcript")
        self.setOpenExternalLinks(False)
        self.setOpenLinks(False)
        self.setPlaceholderText("Start a conversation: type a message below.")
        # Nothing is edited by hand: an undo history would only grow with each token.
        self.document().setUndoRedoEnabled(False)
        self._writer = TranscriptWriter(self)
        self._reply: StreamedReply | None = None
        self._spans: dict[int, tuple[int, int]] = {}  # message id: its document positions
        self._highlighted: int | None = None
        self._marks: list[QTextEdit.ExtraSelection] = []  # the search hit's
        self.hovered_branch: str | None = None  # the branch arrow under the mouse
        self._hover_cursor: QTextCursor | None = None
        self.setMouseTracking(True)
        self.anchorClicked.connect(self._on_anchor_clicked)
        self._edit = InPlaceEdit(self, self._spans)
        self.editor = self._edit.editor
        self._edit.submitted.connect(self.edit_submitted)
        self._edit.cancelled.connect(self.edit_cancelled)

    @property
    def colour(self) -> bool:
        """Whether reply text takes the colour of its tokens' origins."""
        return self._writer.colour

    @colour.setter
    def colour(self, on: bool) -> None:
        self._writer.colour = on

    @property
    def code_blocks(self) -> tuple[str, ...]:
        """Raw text of the shown code blocks; ``copy:<i>`` copies the i-th."""
        return tuple(self._writer.code_blocks)

    @property
    def highlighted_message(self) -> int | None:
        """The message :meth:`highlight_message` marked, until the view changes."""
        return self._highlighted

    def highlight_message(self, message_id: int) -> bool:
        """Scrolls a shown message to the top of the view and marks it, as a search hit.

        The mark stays until the view shows other messages or a reply begins.

        Returns:
            Whether the message is shown (else nothing changes).
        """
        span = self._spans.get(message_id)
        if span is None:
            return False
        start, end = span
        cursor = QTextCursor(self.document())
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        colour = self.palette().color(QPalette.ColorRole.Highlight)
        colour.setAlpha(60)  # a tint: the text keeps its own colours
        tint = QTextCharFormat()
        tint.setBackground(colour)
        tint.setProperty(QTextFormat.Property.FullWidthSelection, True)
        mark = QTextEdit.ExtraSelection()
        mark.cursor = cursor
        mark.format = tint
        self._marks = [mark]
        self._show_marks()
        self._highlighted = message_id
        block = self.document().findBlock(start)
        top = self.document().documentLayout().blockBoundingRect(block).top()
        self.verticalScrollBar().setValue(int(top))
        return True

    def _clear_highlight(self) -> None:
        self._highlighted = None
        self._marks = []
        self.hovered_branch, self._hover_cursor = None, None  # the document is redone
        self._show_marks()

    @property
    def editing_message(self) -> int | None:
        """The message edited in place; ``None`` when none is."""
        return self._edit.message_id

    def begin_edit(self, message_id: int, text: str) -> bool:
        """Lays a wrapping editor prefilled with ``text`` over a shown message.

        It stays until :meth:`end_edit`. When the view shows other messages,
        unsaved text is kept and the editor comes back with the message.

        Returns:
            Whether the message is shown (else nothing changes).
        """
        return self._edit.begin(message_id, text)

    def end_edit(self) -> None:
        """Takes the in-place editor away and gives back the room it took."""
        self._edit.end()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._edit.place()

    @property
    def reply_start(self) -> int | None:
        """Document position where the streaming reply starts; ``None`` between replies."""
        return self._reply.start if self._reply is not None else None

    def show_messages(
        self,
        messages: Sequence[StoredMessage],
        branches: Mapping[int, tuple[int, int]] | None = None,
    ) -> None:
        """Replaces the view with ``messages``.

        Args:
            messages: The messages, oldest first.
            branches: Message id to (1-based index, count) for messages that have
                siblings; they show a switcher.
        """
        self._clear_highlight()
        self._edit.set_aside()
        self.clear()
        self._reply = None
        self._writer.code_blocks.clear()
        self._spans.clear()
        branches = branches or {}
        theme = self._writer.theme()
        cursor = QTextCursor(self.document())
        cursor.beginEditBlock()  # one layout pass for the whole conversation
        for m in messages:
            start = self._writer.open_message(cursor)
            stats_id = m.id if m.role == "assistant" and m.stats is not None else None
            footer = Footer(m.role, m.id, note_of(m), stats_id, branches.get(m.id))
            segments = m.segments if m.role == "assistant" else ()
            self._writer.insert_message(cursor, m.role, m.content, segments, footer, theme)
            self._spans[m.id] = (start, cursor.position())
        cursor.endEditBlock()
        fold_all(self.document())
        self.setTextCursor(cursor)
        self.ensureCursorVisible()
        self._edit.bring_back(messages)

    def append_message(
        self,
        role: str,
        content: str,
        message_id: int | None = None,
        branch: tuple[int, int] | None = None,
    ) -> None:
        """Adds a message at the end; with its id, it gets a footer of actions."""
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        self._writer.open_message(cursor)
        footer = Footer(role, message_id, branch=branch)
        self._writer.insert_message(cursor, role, content, (), footer, self._writer.theme())
        self.setTextCursor(cursor)
        self.ensureCursorVisible()

    def begin_reply(self) -> None:
        """Adds an empty assistant message that :meth:`append_segments` fills."""
        self._clear_highlight()
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        start = self._writer.open_message(cursor)
        cursor.insertText(ROLE_LABELS["assistant"], bold())
        cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        self._reply = StreamedReply(start, cursor.position(), len(self._writer.code_blocks))
        self.setTextCursor(cursor)
        self.ensureCursorVisible()

    def show_reading(self, note: str) -> None:
        """Shows ``note`` in the empty reply (how far the prompt is read) until text comes."""
        reply = self._reply
        if reply is None or reply.segments:
            return
        muted = QTextCharFormat()
        muted.setForeground(self.palette().placeholderText())
        muted.setFontItalic(True)
        self._drop_reading(reply)
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(note, muted)
        reply.reading = True

    def _drop_reading(self, reply: StreamedReply) -> None:
        if reply.reading:
            cursor = QTextCursor(self.document())
            cursor.setPosition(reply.tail_pos)
            cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
            cursor.removeSelectedText()
            reply.reading = False

    def append_segments(self, segments: Sequence[Segment]) -> None:
        """Appends streamed reply text, each run in its origin's colour.

        When the text completes a Markdown block, the reply's text since the
        previous completed block is rendered. The first text replaces any
        note of :meth:`show_reading`.
        """
        if not segments:
            return
        if self._reply is not None:
            self._drop_reading(self._reply)
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        for origin, text in segments:
            cursor.insertText(text, origin_format(origin, self.colour))
        reply = self._reply
        if reply is not None:
            reply.segments += segments
            reply.tail += segments
            cut = reply.splitter.feed("".join(text for _, text in segments))
            if cut is not None:
                self._writer.render_tail(reply, cut)
        if at_bottom:
            bar.setValue(bar.maximum())

    def append_text(self, text: str) -> None:
        """Appends streamed reply text without origins."""
        if text:
            self.append_segments([(None, text)])

    def end_reply(
        self,
        note: str = "",
        stats_id: int | None = None,
        message_id: int | None = None,
        branch: tuple[int, int] | None = None,
    ) -> None:
        """Renders the whole reply once and adds its footer.

        Args:
            note: Why it ended early, such as "Stopped."; shown in italics.
            stats_id: Id of the saved reply when it has statistics: a Stats link.
            message_id: Id of the saved reply: links to copy, regenerate and
                delete it. Without it the footer has only the note and Stats link.
            branch: (1-based index, count) when the reply has siblings.
        """
        reply, self._reply = self._reply, None
        footer = Footer("assistant", message_id, note, stats_id, branch)
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        cursor = QTextCursor(self.document())
        if reply is None:
            cursor.movePosition(QTextCursor.MoveOperation.End)
            if not footer.empty:
                self._writer.insert_footer(cursor, footer)
        else:
            cursor.beginEditBlock()
            self._writer.rewrite(cursor, reply, reply.segments, footer)
            cursor.endEditBlock()
            top = self.cursorForPosition(QPoint(0, 0)).block()  # what the reader sees first
            shown = self._block_top(top) - bar.value()
            fold_all(self.document(), reply.start)  # its reasoning was read as it came
            if not at_bottom:  # the text read stays where it was, or its thoughts' label
                while not top.isVisible() and top.previous().isValid():
                    top = top.previous()
                bar.setValue(round(self._block_top(top) - shown))
        if at_bottom:
            bar.setValue(bar.maximum())

    def createMimeDataFromSelection(self) -> QMimeData:
        """The selection as HTML and text, without the footers' and code headers' links."""
        doc = QTextDocument()
        QTextCursor(doc).insertFragment(self.textCursor().selection())
        spans = []  # each chrome line with the line break before it (after it, first)
        block = doc.begin()
        while block.isValid():
            if is_chrome(block) or is_folded_away(block):
                start, end = block.position(), block.position() + block.length() - 1
                if start > 0:
                    spans.append((start - 1, end))
                else:
                    spans.append((0, min(end + 1, doc.characterCount() - 1)))
            block = block.next()
        for start, end in reversed(spans):  # from the end, so earlier positions hold
            cut = QTextCursor(doc)
            cut.setPosition(start)
            cut.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
            cut.removeSelectedText()
        mime = QMimeData()
        mime.setHtml(doc.toHtml())
        mime.setText(doc.toPlainText().strip("\n"))
        return mime

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        super().mouseMoveEvent(event)
        pos = event.position().toPoint()
        href = self.anchorAt(pos)
        hovered = href if href.partition(":")[0] in BRANCH_DELTAS else None
        if hovered != self.hovered_branch:
            self.hovered_branch = hovered
            self._hover_cursor = self._anchor_cursor(pos, hovered) if hovered else None
            self._show_marks()

    def leaveEvent(self, event: QEvent) -> None:
        super().leaveEvent(event)
        if self.hovered_branch is not None:
            self.hovered_branch, self._hover_cursor = None, None
            self._show_marks()

    def _anchor_cursor(self, pos: QPoint, href: str) -> QTextCursor | None:
        """A cursor over the link ``href`` at viewport point ``pos``."""
        block = self.cursorForPosition(pos).block()
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.charFormat().anchorHref() == href:
                cursor = QTextCursor(self.document())
                cursor.setPosition(fragment.position())
                cursor.setPosition(
                    fragment.position() + fragment.length(), QTextCursor.MoveMode.KeepAnchor
                )
                return cursor
            it += 1
        return None

    def _block_top(self, block: QTextBlock) -> float:
        return self.document().documentLayout().blockBoundingRect(block).top()

    def _toggle_fold(self, block: QTextBlock) -> None:
        """Folds or opens the reasoning under the label ``block``."""
        if is_label(block):
            set_folded(block, not is_folded(block))

    def _show_marks(self) -> None:
        """The search hit's mark, and the hover state of the branch arrow under the mouse."""
        marks = list(self._marks)
        cursor = self._hover_cursor
        if self.hovered_branch is not None and cursor is not None:
            hover = QTextEdit.ExtraSelection()
            hover.cursor = cursor
            tint = QTextCharFormat()
            tint.setBackground(self.palette().color(QPalette.ColorRole.Mid))
            hover.format = tint
            marks.append(hover)
        self.setExtraSelections(marks)

    @Slot(QUrl)
    def _on_anchor_clicked(self, url: QUrl) -> None:
        scheme, path = url.scheme(), url.path()
        if scheme == COPY_SCHEME and path.isdigit():
            index = int(path)
            if index < len(self._writer.code_blocks):
                code = self._writer.code_blocks[index]
                QGuiApplication.clipboard().setText(code)
                self.code_copied.emit(code)
        elif scheme in ACTION_SIGNALS and path.isdigit():
            getattr(self, ACTION_SIGNALS[scheme]).emit(int(path))
        elif scheme in BRANCH_DELTAS and path.isdigit():
            self.branch_requested.emit(int(path), BRANCH_DELTAS[scheme])
        elif scheme == FOLD_SCHEME:
            self._toggle_fold(self.textCursor().block())  # a clicked link holds the cursor
        elif scheme not in ACTION_SIGNALS and scheme not in BRANCH_DELTAS:
            self.link_clicked.emit(url)  # shown in replies, never opened here
