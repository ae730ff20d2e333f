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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape

from PySide6.QtCore import QEvent, QPoint, QUrl, Signal, Slot
from PySide6.QtGui import (
    QFontDatabase,
    QGuiApplication,
    QMouseEvent,
    QPalette,
    QResizeEvent,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextDocumentFragment,
    QTextFormat,
)
from PySide6.QtWidgets import QTextBrowser, QTextEdit, QWidget

from app.engine.types import Origin, Segment
from app.store import StoredMessage
from app.ui.markdown import COPY_SCHEME, BlockSplitter, Theme, align, render_markdown
from app.ui.message_editor import MessageEditor
from app.ui.transcript_style import (
    ACTION_SIGNALS,
    ARROW_TEXT,
    BRANCH_DELTAS,
    COPY_MESSAGE_SCHEME,
    DELETE_SCHEME,
    EDIT_SCHEME,
    NEXT_BRANCH_SCHEME,
    ORIGIN_COLORS,
    ORIGIN_LABELS,
    PREVIOUS_BRANCH_SCHEME,
    REGENERATE_SCHEME,
    ROLE_LABELS,
    STATS_SCHEME,
    TOOLTIPS,
    bold,
    branch_arrow_format,
    header_format,
    is_code_header,
    note_of,
    origin_format,
    split_segments,
)

__all__ = ["ORIGIN_COLORS", "ORIGIN_LABELS", "TranscriptView", "origin_format"]


@dataclass(frozen=True, slots=True)
class _Footer:
    """What the line under a message shows."""

    role: str
    message_id: int | None = None
    note: str = ""
    stats_id: int | None = None
    branch: tuple[int, int] | None = None  # (1-based index, count) among its siblings

    @property
    def empty(self) -> bool:
        return self.message_id is None and not self.note and self.stats_id is None


@dataclass(slots=True)
class _Reply:
    """The reply that streams in: where it lies in the document and its source so far."""

    start: int  # document position of its header block
    tail_pos: int  # document position of the text not yet rendered as Markdown
    code_start: int  # index of its first code block in the view's list
    segments: list[Segment] = field(default_factory=list)
    tail_src: int = 0  # source offset of the text not yet rendered
    tail: list[Segment] = field(default_factory=list)
    splitter: BlockSplitter = field(default_factory=BlockSplitter)
    reading: bool = False  # a note of how far the prompt is read stands in for its text


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
        self.colour = True
        self._code_blocks: list[str] = []
        self._reply: _Reply | None = None
        self._spans: dict[int, tuple[int, int]] = {}  # message id: its document positions
        self._highlighted: int | None = None
        self._marks: list[QTextEdit.ExtraSelection] = []  # the search hit's
        self.hovered_branch: str | None = None  # the branch arrow under the mouse
        self._hover_cursor: QTextCursor | None = None
        self.setMouseTracking(True)
        self.anchorClicked.connect(self._on_anchor_clicked)
        self._editing: int | None = None  # the message edited in place
        self._edit_base = ""  # the text the edit started from
        # Unsaved edits of messages not shown now: they come back with the message.
        self._drafts: dict[int, str] = {}
        self._reserved = 0.0  # room added under it for a taller editor
        self._placing = False
        self.editor = MessageEditor(self.viewport())
        self.editor.hide()
        self.editor.submitted.connect(self._on_editor_submitted)
        self.editor.cancelled.connect(self._on_editor_cancelled)
        self.editor.height_changed.connect(self._on_editor_height_changed)
        self.verticalScrollBar().valueChanged.connect(self._on_scrolled)
        self.document().documentLayout().documentSizeChanged.connect(self._on_scrolled)

    @property
    def code_blocks(self) -> tuple[str, ...]:
        """Raw text of the shown code blocks; ``copy:<i>`` copies the i-th."""
        return tuple(self._code_blocks)

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
        return self._editing

    def begin_edit(self, message_id: int, text: str) -> bool:
        """Lays a wrapping editor prefilled with ``text`` over a shown message.

        It stays until :meth:`end_edit`. When the view shows other messages,
        unsaved text is kept and the editor comes back with the message.

        Returns:
            Whether the message is shown (else nothing changes).
        """
        if message_id not in self._spans:
            return False
        self.end_edit()
        self._editing, self._edit_base = message_id, text
        self.editor.start(self._drafts.pop(message_id, text))
        self.editor.show()
        self._place_editor()
        self.editor.field.setFocus()
        return True

    def end_edit(self) -> None:
        """Takes the in-place editor away and gives back the room it took."""
        if self._editing is None:
            return
        self._placing = True  # giving the room back must not place the editor again
        try:
            self._reserve(0.0)
        finally:
            self._placing = False
        self._editing = None
        self.editor.hide()

    @Slot(str)
    def _on_editor_submitted(self, text: str) -> None:
        if self._editing is not None:
            self.edit_submitted.emit(self._editing, text)

    @Slot()
    def _on_editor_cancelled(self) -> None:
        message_id = self._editing
        self.end_edit()
        if message_id is not None:
            self._drafts.pop(message_id, None)
        if message_id is not None:
            self.edit_cancelled.emit(message_id)

    @Slot()
    def _on_editor_height_changed(self) -> None:
        self._place_editor()

    @Slot()
    def _on_scrolled(self) -> None:
        self._place_editor()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._place_editor()

    def _message_blocks(self) -> tuple[QTextBlock, QTextBlock] | None:
        """The body block and the last block of the message being edited."""
        span = self._spans.get(self._editing) if self._editing is not None else None
        if span is None:
            return None
        doc = self.document()
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

    def _place_editor(self) -> None:
        """Lays the editor over the edited message's text and footer."""
        blocks = self._message_blocks()
        if blocks is None or self._placing:
            return
        self._placing = True  # making room relays the document, which asks again
        try:
            self._lay_editor(blocks)
        finally:
            self._placing = False

    def _lay_editor(self, blocks: tuple[QTextBlock, QTextBlock]) -> None:
        layout = self.document().documentLayout()
        body, last = (layout.blockBoundingRect(b) for b in blocks)
        # Block rectangles leave out margins: the room made below does not count.
        shown = last.bottom() - body.top()
        wanted = self.editor.wanted_height()
        self._reserve(max(wanted - shown, 0.0))
        left = int(body.left()) - self.horizontalScrollBar().value()
        top = int(body.top()) - self.verticalScrollBar().value()
        width = self.viewport().width() - 2 * max(int(body.left()), 0)
        self.editor.setGeometry(left, top, width, max(wanted, int(shown)))

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
        if self._editing is not None and self.editor.text() != self._edit_base:
            self._drafts[self._editing] = self.editor.text()
        self.end_edit()
        self.clear()
        self._reply = None
        self._code_blocks.clear()
        self._spans.clear()
        branches = branches or {}
        theme = self._theme()
        cursor = QTextCursor(self.document())
        cursor.beginEditBlock()  # one layout pass for the whole conversation
        for m in messages:
            start = self._open_message(cursor)
            stats_id = m.id if m.role == "assistant" and m.stats is not None else None
            footer = _Footer(m.role, m.id, note_of(m), stats_id, branches.get(m.id))
            segments = m.segments if m.role == "assistant" else ()
            self._insert_message(cursor, m.role, m.content, segments, footer, theme)
            self._spans[m.id] = (start, cursor.position())
        cursor.endEditBlock()
        self.setTextCursor(cursor)
        self.ensureCursorVisible()
        for m in messages:  # a draft the message now says was saved
            if self._drafts.get(m.id) == m.content:
                del self._drafts[m.id]
        unsaved = next((m for m in messages if m.id in self._drafts), None)
        if unsaved is not None:
            self.begin_edit(unsaved.id, unsaved.content)

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
        self._open_message(cursor)
        footer = _Footer(role, message_id, branch=branch)
        self._insert_message(cursor, role, content, (), footer, self._theme())
        self.setTextCursor(cursor)
        self.ensureCursorVisible()

    def begin_reply(self) -> None:
        """Adds an empty assistant message that :meth:`append_segments` fills."""
        self._clear_highlight()
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        start = self._open_message(cursor)
        cursor.insertText(ROLE_LABELS["assistant"], bold())
        cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        self._reply = _Reply(start, cursor.position(), len(self._code_blocks))
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

    def _drop_reading(self, reply: _Reply) -> None:
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
                self._render_tail(reply, cut)
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
        footer = _Footer("assistant", message_id, note, stats_id, branch)
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        cursor = QTextCursor(self.document())
        if reply is None:
            cursor.movePosition(QTextCursor.MoveOperation.End)
            if not footer.empty:
                self._insert_footer(cursor, footer)
        else:
            cursor.beginEditBlock()
            cursor.setPosition(reply.start)
            cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
            cursor.removeSelectedText()
            cursor.setBlockFormat(header_format())  # the block took the format of the last one
            del self._code_blocks[reply.code_start :]
            text = "".join(t for _, t in reply.segments)
            self._insert_message(cursor, "assistant", text, reply.segments, footer, self._theme())
            cursor.endEditBlock()
        if at_bottom:
            bar.setValue(bar.maximum())

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
            if index < len(self._code_blocks):
                code = self._code_blocks[index]
                QGuiApplication.clipboard().setText(code)
                self.code_copied.emit(code)
        elif scheme in ACTION_SIGNALS and path.isdigit():
            getattr(self, ACTION_SIGNALS[scheme]).emit(int(path))
        elif scheme in BRANCH_DELTAS and path.isdigit():
            self.branch_requested.emit(int(path), BRANCH_DELTAS[scheme])
        elif scheme not in ACTION_SIGNALS and scheme not in BRANCH_DELTAS:
            self.link_clicked.emit(url)  # shown in replies, never opened here

    # Building the document

    def _open_message(self, cursor: QTextCursor) -> int:
        """Starts a message's header block at ``cursor``; returns its position."""
        if not self.document().isEmpty() and cursor.position() > 0:
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        cursor.setBlockFormat(header_format())
        return cursor.position()

    def _insert_message(
        self,
        cursor: QTextCursor,
        role: str,
        content: str,
        segments: Sequence[Segment],
        footer: _Footer,
        theme: Theme,
    ) -> None:
        """Fills the header block at ``cursor``, the body and the footer."""
        label = ROLE_LABELS.get(role, role)
        if role == "assistant":
            start = cursor.position()
            rendered = render_markdown(content, theme, len(self._code_blocks))
            self._code_blocks.extend(rendered.code_blocks)
            # The label leads the fragment: its first block merges into the header block.
            head = f"<p><b>{escape(label)}</b></p>\n"
            self._insert_html(cursor, head + rendered.html, keep_first_format=False)
            body = self.document().findBlock(start).next()
            self._colour(body, cursor.position(), content, segments, rendered.hidden)
        else:
            cursor.insertText(label, bold())
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
            cursor.insertText(content, QTextCharFormat())
        if not footer.empty:
            self._insert_footer(cursor, footer)

    def _render_tail(self, reply: _Reply, cut: int) -> None:
        """Renders the reply's source up to ``cut`` in place of its plain text."""
        length = cut - reply.tail_src
        chunk, rest = split_segments(reply.tail, length)
        source = "".join(t for _, t in chunk)
        cursor = QTextCursor(self.document())
        cursor.beginEditBlock()
        cursor.setPosition(reply.tail_pos)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        cursor.setBlockFormat(QTextBlockFormat())  # the block took the format of the last one
        if source.strip():
            rendered = render_markdown(source, self._theme(), len(self._code_blocks))
            self._code_blocks.extend(rendered.code_blocks)
            start = reply.tail_pos
            plain = self._insert_html(cursor, rendered.html, keep_first_format=True)
            first = self.document().findBlock(start)
            if not plain and first.length() == 1:
                # A list or table starts after the block it was inserted at: drop that block.
                QTextCursor(first).deletePreviousChar()
                first = self.document().findBlock(start - 1).next()
            self._colour(first, cursor.position(), source, chunk, rendered.hidden)
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
            reply.tail_pos = cursor.position()
        for origin, text in rest:
            cursor.insertText(text, origin_format(origin, self.colour))
        cursor.endEditBlock()
        reply.tail_src = cut
        reply.tail = rest

    def _insert_html(self, cursor: QTextCursor, html: str, keep_first_format: bool) -> bool:
        """Inserts ``html`` at ``cursor``; returns whether it starts with a plain block.

        The fragment's first block merges into the block at the cursor and takes
        its format; ``keep_first_format`` gives it the fragment's own (a code
        block's background, a heading's margins). A list or table instead starts
        in a block of its own, after the one at the cursor.
        """
        fragment = QTextDocument()
        fragment.setHtml(html)
        first = fragment.begin()
        plain = first.textList() is None and QTextCursor(first).currentTable() is None
        fmt = first.blockFormat() if keep_first_format and plain else None
        start = cursor.position()
        cursor.insertFragment(QTextDocumentFragment(fragment))
        if fmt is not None:
            fix = QTextCursor(self.document())
            fix.setPosition(start)
            fix.setBlockFormat(fmt)
        return plain

    def _colour(
        self,
        first: QTextBlock,
        end: int,
        source: str,
        segments: Sequence[Segment],
        hidden: Sequence[tuple[int, int]],
    ) -> None:
        """Gives the rendered text from block ``first`` to ``end`` its tokens' colours."""
        if not self.colour or not segments:
            return
        if "".join(text for _, text in segments) != source:
            return  # partial runs would colour the wrong text
        origins: list[Origin | None] = []
        for origin, text in segments:
            origins += [origin] * len(text)
        parts: list[str] = []
        positions: list[int] = []
        block = first
        while block.isValid() and block.position() < end:
            if not is_code_header(block):
                text = block.text()[: max(end - block.position(), 0)]
                if parts:
                    parts.append("\n")
                    positions.append(-1)  # between blocks: nothing to colour
                parts.append(text)
                positions += range(block.position(), block.position() + len(text))
            block = block.next()
        matches = align(source, "".join(parts), hidden)
        cursor = QTextCursor(self.document())
        cursor.beginEditBlock()  # one layout pass for all the runs
        formats: dict[Origin, QTextCharFormat] = {}

        def paint(origin: Origin | None, start: int, stop: int) -> None:
            if origin is None:
                return
            if origin not in formats:
                formats[origin] = origin_format(origin, True)
            cursor.setPosition(start)
            cursor.setPosition(stop, QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(formats[origin])

        run: Origin | None = None
        run_start = last = -2
        for pos, src in zip(positions, matches, strict=True):
            origin = origins[src] if src >= 0 and pos >= 0 else None
            if origin not in ORIGIN_COLORS:
                origin = None
            if origin is not None and origin == run and pos == last + 1:
                last = pos
                continue
            paint(run, run_start, last + 1)
            run, run_start, last = origin, pos, pos
        paint(run, run_start, last + 1)
        cursor.endEditBlock()

    def _insert_footer(self, cursor: QTextCursor, footer: _Footer) -> None:
        """Adds the small line of links under a message."""
        base = QTextCharFormat()
        base.setForeground(self.palette().placeholderText())
        size = self.font().pointSizeF()
        if size > 0:
            base.setFontPointSize(size * 0.85)
        block = QTextBlockFormat()
        block.setTopMargin(2)
        cursor.insertBlock(block, base)
        if footer.note:
            italic = QTextCharFormat(base)
            italic.setFontItalic(True)
            cursor.insertText(footer.note, italic)
        items: list[tuple[str, str]] = []  # (text, href) of each action
        mid = footer.message_id
        if mid is not None:
            if footer.role == "user":
                items += [("Edit", EDIT_SCHEME), ("Copy", COPY_MESSAGE_SCHEME)]
            elif footer.role == "assistant":
                items += [("Copy", COPY_MESSAGE_SCHEME), ("Regenerate", REGENERATE_SCHEME)]
            else:
                items.append(("Copy", COPY_MESSAGE_SCHEME))
            items.append(("Delete", DELETE_SCHEME))
        if footer.stats_id is not None:
            items.append(("Stats…", f"{STATS_SCHEME}:{footer.stats_id}"))
        links = [(text, href if ":" in href else f"{href}:{mid}") for text, href in items]
        if mid is None:  # as before message ids: the note, then the Stats link
            base.setFontItalic(True)
        if footer.note and (links or footer.branch):
            cursor.insertText("  ", base)
        if footer.branch is not None and mid is not None:
            index, count = footer.branch
            previous = f"{PREVIOUS_BRANCH_SCHEME}:{mid}" if index > 1 else None
            following = f"{NEXT_BRANCH_SCHEME}:{mid}" if index < count else None
            arrow = branch_arrow_format(base, self.font().pointSizeF())
            self._insert_link(cursor, arrow, ARROW_TEXT.format("‹"), previous, "Previous version")
            cursor.insertText(f" {index}/{count} ", base)
            self._insert_link(cursor, arrow, ARROW_TEXT.format("›"), following, "Next version")
            if links:
                cursor.insertText("   ", base)
        for i, (text, href) in enumerate(links):
            if i:
                cursor.insertText(" · ", base)
            self._insert_link(cursor, base, text, href, TOOLTIPS.get(text, ""))

    def _insert_link(
        self, cursor: QTextCursor, base: QTextCharFormat, text: str, href: str | None, tip: str
    ) -> None:
        if href is None:  # the end of the branches: shown, but not a link
            cursor.insertText(text, base)
            return
        link = QTextCharFormat(base)
        link.setAnchor(True)
        link.setAnchorHref(href)
        link.setForeground(self.palette().link())
        link.setToolTip(tip)
        cursor.insertText(text, link)

    def _theme(self) -> Theme:
        """Markdown colours from the palette; a dark window picks the dark code style."""
        p = self.palette()
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()
        return Theme(
            dark=p.color(QPalette.ColorRole.Window).lightnessF() < 0.5,
            code_background=p.color(QPalette.ColorRole.AlternateBase).name(),
            muted=p.color(QPalette.ColorRole.PlaceholderText).name(),
            link=p.color(QPalette.ColorRole.Link).name(),
            mono_family=f"'{mono}', monospace",
            rule=p.color(QPalette.ColorRole.Mid).name(),
        )
