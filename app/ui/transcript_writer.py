"""Writing the transcript's document: messages, their footers and a reply's rendered text.

:class:`TranscriptWriter` turns a message into blocks of the view's document: a
bold header, the body (Markdown for replies, coloured by the origin of each
token) and the footer of links. :class:`TranscriptView` decides what is
written where; the writer only writes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from PySide6.QtGui import (
    QFontDatabase,
    QPalette,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextDocumentFragment,
)
from PySide6.QtWidgets import QTextEdit

from app.engine.types import Origin, Segment
from app.store.reasoning import opened_before
from app.ui.markdown import BlockSplitter, Theme, align, render_markdown
from app.ui.transcript_style import (
    ARROW_TEXT,
    COPY_MESSAGE_SCHEME,
    DELETE_SCHEME,
    EDIT_SCHEME,
    FOOTER_PROPERTY,
    NEXT_BRANCH_SCHEME,
    ORIGIN_COLORS,
    PREVIOUS_BRANCH_SCHEME,
    REGENERATE_SCHEME,
    ROLE_LABELS,
    STATS_SCHEME,
    TOOLTIPS,
    bold,
    branch_arrow_format,
    header_format,
    is_chrome,
    origin_format,
    split_segments,
)


@dataclass(frozen=True, slots=True)
class Footer:
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
class StreamedReply:
    """The reply that streams in: where it lies in the document and its source so far."""

    start: int  # document position of its header block
    tail_pos: int  # document position of the text not yet rendered as Markdown
    code_start: int  # index of its first code block in the writer's list
    segments: list[Segment] = field(default_factory=list)
    tail_src: int = 0  # source offset of the text not yet rendered
    tail: list[Segment] = field(default_factory=list)
    splitter: BlockSplitter = field(default_factory=BlockSplitter)
    tail_code: int | None = None  # first code block of a provisional render of the tail
    reading: bool = False  # a note of how far the prompt is read stands in for its text
    thinking: bool = False  # whether the text not yet rendered starts inside reasoning


class TranscriptWriter:
    """Writes messages into the document of ``view``, in its palette and font.

    Attributes:
        colour: Whether reply text takes the colour of its tokens' origins.
        code_blocks: Raw text of the code blocks written, in document order;
            a block's copy link carries its index.

    Args:
        view: The text view whose document is written.
    """

    def __init__(self, view: QTextEdit) -> None:
        self._view = view
        self.colour = True
        self.code_blocks: list[str] = []

    def open_message(self, cursor: QTextCursor) -> int:
        """Starts a message's header block at ``cursor``; returns its position."""
        if not self._view.document().isEmpty() and cursor.position() > 0:
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        cursor.setBlockFormat(header_format())
        return cursor.position()

    def insert_message(
        self,
        cursor: QTextCursor,
        role: str,
        content: str,
        segments: Sequence[Segment],
        footer: Footer,
        theme: Theme,
        foldable: bool = True,
    ) -> None:
        """Fills the header block at ``cursor``, the body and the footer; ``foldable``: whether
        a reply's reasoning label folds it (once the reply has ended)."""
        label = ROLE_LABELS.get(role, role)
        if role == "assistant":
            start = cursor.position()
            rendered = render_markdown(content, theme, len(self.code_blocks), foldable=foldable)
            self.code_blocks.extend(rendered.code_blocks)
            # The label leads the fragment: its first block merges into the header block.
            head = f"<p><b>{escape(label)}</b></p>\n"
            self._insert_html(cursor, head + rendered.html, keep_first_format=False)
            body = self._view.document().findBlock(start).next()
            self._colour(body, cursor.position(), content, segments, rendered.hidden)
        else:
            cursor.insertText(label, bold())
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
            cursor.insertText(content, QTextCharFormat())
        if not footer.empty:
            self.insert_footer(cursor, footer)

    def render_tail(self, reply: StreamedReply, cut: int) -> None:
        """Renders the reply's source up to ``cut`` in place of its plain text.

        Within a code fence not closed yet the render is provisional: the fence is
        closed virtually, and the next render starts from the same place again.
        """
        doc = self._view.document()
        if reply.tail_code is not None:  # the provisional render's code blocks go
            del self.code_blocks[reply.tail_code :]
        provisional = reply.splitter.in_fence
        reply.tail_code = len(self.code_blocks) if provisional else None
        length = cut - reply.tail_src
        chunk, rest = split_segments(reply.tail, length)
        source = "".join(t for _, t in chunk)
        later = reply.tail_src > 0
        if later and not reply.thinking and not provisional and opened_before(source, False):
            # Its prompt opened the reasoning that this part closes: what was rendered
            # before it is reasoning too, so the reply renders again from its start.
            self._render_from_start(reply, cut)
            return
        closed = reply.splitter.close_fence(source)
        chunk = [*chunk, (None, closed[len(source) :])] if closed != source else chunk
        cursor = QTextCursor(doc)
        cursor.beginEditBlock()
        cursor.setPosition(reply.tail_pos)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        cursor.setBlockFormat(QTextBlockFormat())  # the block took the format of the last one
        if source.strip():
            rendered = render_markdown(
                closed,
                self.theme(),
                len(self.code_blocks),
                thinking=reply.thinking,
                begins=not reply.tail_src,
                foldable=False,
            )
            self.code_blocks.extend(rendered.code_blocks)
            start = reply.tail_pos
            plain = self._insert_html(cursor, rendered.html, keep_first_format=True)
            first = doc.findBlock(start)
            if not plain and first.length() == 1:
                # A list or table starts after the block it was inserted at: drop that block.
                QTextCursor(first).deletePreviousChar()
                first = doc.findBlock(start - 1).next()
            self._colour(first, cursor.position(), closed, chunk, rendered.hidden)
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
            # A provisional render is replaced whole by the next one, from its first block.
            reply.tail_pos = first.position() if provisional else cursor.position()
        for origin, text in rest:
            cursor.insertText(text, origin_format(origin, self.colour))
        cursor.endEditBlock()
        if not provisional:
            reply.tail_src = cut
            reply.tail = rest
            reply.thinking = reply.splitter.thinking_at_cut

    def rewrite(
        self,
        cursor: QTextCursor,
        reply: StreamedReply,
        segments: Sequence[Segment],
        footer: Footer,
        foldable: bool = True,
    ) -> None:
        """Replaces all that is written of ``reply`` with ``segments`` rendered whole and
        ``footer``, leaving ``cursor`` after them; ``foldable`` as :meth:`insert_message`'s
        (false while the reply streams)."""
        cursor.setPosition(reply.start)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        cursor.setBlockFormat(header_format())  # the block took the format of the last one
        del self.code_blocks[reply.code_start :]
        text = "".join(t for _, t in segments)
        self.insert_message(cursor, "assistant", text, segments, footer, self.theme(), foldable)

    def _render_from_start(self, reply: StreamedReply, cut: int) -> None:
        """Renders the reply's source up to ``cut`` whole in place of what was rendered of it;
        the text after ``cut`` stays plain, as streamed."""
        cursor = QTextCursor(self._view.document())
        cursor.beginEditBlock()
        head, rest = split_segments(reply.segments, cut)
        self.rewrite(cursor, reply, head, Footer("assistant"), foldable=False)
        cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        reply.tail_pos = cursor.position()
        for origin, text in rest:
            cursor.insertText(text, origin_format(origin, self.colour))
        cursor.endEditBlock()
        reply.tail_src, reply.tail, reply.tail_code = cut, rest, None
        reply.thinking = reply.splitter.thinking_at_cut

    def insert_footer(self, cursor: QTextCursor, footer: Footer) -> None:
        """Adds the small line of links under a message."""
        base = QTextCharFormat()
        base.setForeground(self._view.palette().placeholderText())
        size = self._view.font().pointSizeF()
        if size > 0:
            base.setFontPointSize(size * 0.85)
        block = QTextBlockFormat()
        block.setTopMargin(2)
        block.setProperty(FOOTER_PROPERTY, True)
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
            arrow = branch_arrow_format(base, self._view.font().pointSizeF())
            self._insert_link(cursor, arrow, ARROW_TEXT.format("‹"), previous, "Previous version")
            cursor.insertText(f" {index}/{count} ", base)
            self._insert_link(cursor, arrow, ARROW_TEXT.format("›"), following, "Next version")
            if links:
                cursor.insertText("   ", base)
        for i, (text, href) in enumerate(links):
            if i:
                cursor.insertText(" · ", base)
            self._insert_link(cursor, base, text, href, TOOLTIPS.get(text, ""))

    def theme(self) -> Theme:
        """Markdown colours from the palette; a dark window picks the dark code style."""
        p = self._view.palette()
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()
        return Theme(
            dark=p.color(QPalette.ColorRole.Window).lightnessF() < 0.5,
            code_background=p.color(QPalette.ColorRole.AlternateBase).name(),
            muted=p.color(QPalette.ColorRole.PlaceholderText).name(),
            link=p.color(QPalette.ColorRole.Link).name(),
            mono_family=f"'{mono}', monospace",
            rule=p.color(QPalette.ColorRole.Mid).name(),
        )

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
            fix = QTextCursor(self._view.document())
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
            if not is_chrome(block):  # a code block's header, a reasoning label
                text = block.text()[: max(end - block.position(), 0)]
                if parts:
                    parts.append("\n")
                    positions.append(-1)  # between blocks: nothing to colour
                parts.append(text)
                positions += range(block.position(), block.position() + len(text))
            block = block.next()
        matches = align(source, "".join(parts), hidden)
        cursor = QTextCursor(self._view.document())
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

    def _insert_link(
        self, cursor: QTextCursor, base: QTextCharFormat, text: str, href: str | None, tip: str
    ) -> None:
        if href is None:  # the end of the branches: shown, but not a link
            cursor.insertText(text, base)
            return
        link = QTextCharFormat(base)
        link.setAnchor(True)
        link.setAnchorHref(href)
        link.setForeground(self._view.palette().link())
        link.setToolTip(tip)
        cursor.insertText(text, link)
