"""The transcript: Markdown, coloured origins, streaming and the footer of actions."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from PySide6.QtCore import QEvent, QUrl
from PySide6.QtGui import QColor, QGuiApplication, QPalette, QTextCharFormat, QTextCursor
from pytestqt.qtbot import QtBot

from app.engine.types import Origin, Segment, Stats
from app.store import StoredMessage
from app.ui import transcript_writer as transcript_module
from app.ui.markdown import BlockSplitter, align, render_markdown
from app.ui.transcript import ORIGIN_COLORS, TranscriptView

T, D, C, B, L = Origin.TARGET, Origin.DRAFT, Origin.CORRECTION, Origin.BONUS, Origin.LOOKUP


def _view(qtbot: QtBot) -> TranscriptView:
    view = TranscriptView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    return view


def _message(
    mid: int,
    role: str,
    content: str,
    segments: tuple[Segment, ...] = (),
    stats: Stats | None = None,
    finish_reason: str | None = None,
) -> StoredMessage:
    return StoredMessage(
        mid,
        1,
        role,  # type: ignore[arg-type]
        content,
        0.0,
        finish_reason=finish_reason,
        stats=stats,
        segments=segments,
    )


def _fragments(view: TranscriptView) -> Iterator[tuple[int, str, QTextCharFormat]]:
    """Position, text and format of each run of one format in the document."""
    block = view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            f = it.fragment()
            yield f.position(), f.text(), f.charFormat()
            it += 1
        block = block.next()


def _links(view: TranscriptView) -> list[tuple[str, str]]:
    return [(text, fmt.anchorHref()) for _, text, fmt in _fragments(view) if fmt.isAnchor()]


def _href(view: TranscriptView, text: str, nth: int = 0) -> str:
    return [href for t, href in _links(view) if t == text][nth]


def _position(view: TranscriptView, text: str) -> int:
    found = view.document().find(text)
    assert not found.isNull(), text
    return found.selectionStart()


def _format(view: TranscriptView, pos: int) -> QTextCharFormat:
    cursor = QTextCursor(view.document())
    cursor.setPosition(pos + 1)  # the format of the character before the cursor
    return cursor.charFormat()


def _background(view: TranscriptView, pos: int) -> QColor | None:
    fmt = _format(view, pos)
    return fmt.background().color() if fmt.hasProperty(fmt.Property.BackgroundBrush) else None


def _backgrounds(view: TranscriptView, text: str) -> list[QColor | None]:
    start = _position(view, text)
    return [_background(view, start + i) for i in range(len(text))]


def _lines(view: TranscriptView) -> list[str]:
    return view.toPlainText().split("\n")


def _blocks(view: TranscriptView) -> list[tuple[str, float, float, int, bool]]:
    """Text, margins, heading level and list membership of each block."""
    out = []
    block = view.document().begin()
    while block.isValid():
        fmt = block.blockFormat()
        out.append(
            (
                block.text(),
                fmt.topMargin(),
                fmt.bottomMargin(),
                fmt.headingLevel(),
                block.textList() is not None,
            )
        )
        block = block.next()
    return out


def _segments(pieces: list[str]) -> list[Segment]:
    origins = (D, B, T, C, L)
    return [(origins[i % len(origins)], p) for i, p in enumerate(pieces)]


# Markdown


def test_markdown_elements_render(qtbot: QtBot) -> None:
    view = _view(qtbot)
    content = (
        "# Plan\n\nSome **bold** and `inline()` text.\n\n- one\n- two\n\n"
        "| Name | Size |\n|---|---:|\n| cat | 3 |\n\n"
        "```python\ndef area(r):\n    return 3.14 * r * r\n```\n"
    )
    view.show_messages([_message(1, "assistant", content)])
    text = view.toPlainText()
    for syntax in ("# ", "**", "`", "- one", "|", "```"):
        assert syntax not in text, syntax
    doc = view.document()
    assert doc.findBlock(_position(view, "Plan")).blockFormat().headingLevel() == 1
    assert _format(view, _position(view, "bold")).fontWeight() == 700
    assert _format(view, _position(view, "Some")).fontWeight() != 700
    item = doc.findBlock(_position(view, "two"))
    assert item.textList() is not None and item.textList().count() == 2
    cell = QTextCursor(doc)
    cell.setPosition(_position(view, "cat"))
    table = cell.currentTable()
    assert table is not None and (table.rows(), table.columns()) == (2, 2)
    mono = _format(view, _position(view, "inline()")).fontFamilies()
    assert isinstance(mono, list) and mono[-1] == "monospace"
    # Highlighted code: the keyword and the number take colours of their own.
    keyword = _format(view, _position(view, "def")).foreground().color()
    number = _format(view, _position(view, "3.14")).foreground().color()
    name = _format(view, _position(view, "area")).foreground().color()
    assert len({keyword.name(), number.name(), name.name()}) == 3
    assert _format(view, _position(view, "return")).fontFamilies()[-1] == "monospace"
    code_block = doc.findBlock(_position(view, "return"))
    alternate = view.palette().color(QPalette.ColorRole.AlternateBase)
    assert code_block.blockFormat().background().color() == alternate
    assert "    return 3.14 * r * r" in text  # indentation kept


def test_html_in_a_reply_is_shown_as_text(qtbot: QtBot) -> None:
    view = _view(qtbot)
    content = (
        "Try <b>this</b> and <a href='evil:1'>that</a> <img src='/etc/hosts'> ![pic](/tmp/x.png)"
    )
    view.show_messages([_message(1, "assistant", content)])
    text = view.toPlainText()
    assert "<b>this</b>" in text and "<a href='evil:1'>that</a>" in text
    assert _format(view, _position(view, "this")).fontWeight() != 700
    assert "\ufffc" not in text  # no image was loaded
    assert ("pic", "/tmp/x.png") in _links(view)  # an image shows as a link
    assert all(href != "evil:1" for _, href in _links(view))


def test_links_are_shown_but_never_opened(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.show_messages([_message(1, "assistant", "See [the docs](https://example.com/docs).")])
    assert ("the docs", "https://example.com/docs") in _links(view)
    with qtbot.waitSignal(view.link_clicked) as blocker:
        view.anchorClicked.emit(QUrl("https://example.com/docs"))
    assert blocker.args == [QUrl("https://example.com/docs")]
    assert view.source().isEmpty()  # nothing was navigated to


def test_copy_link_puts_the_exact_code_on_the_clipboard(qtbot: QtBot) -> None:
    view = _view(qtbot)
    first = "print('one')"
    second = "if x:\n\treturn {'a': 1}  # <tag> & co\n\n  end"
    view.show_messages(
        [
            _message(1, "assistant", f"```python\n{first}\n```"),
            _message(2, "assistant", f"Then:\n\n```\n{second}\n```\n"),
        ]
    )
    copy_links = [
        href for text, href in _links(view) if text == "Copy" and href.startswith("copy:")
    ]
    assert copy_links == ["copy:0", "copy:1"]
    assert "python" in _lines(view)[_lines(view).index("Copy · python")]
    QGuiApplication.clipboard().setText("")
    with qtbot.waitSignal(view.code_copied) as blocker:
        view.anchorClicked.emit(QUrl(copy_links[1]))
    assert QGuiApplication.clipboard().text() == second
    assert blocker.args == [second]
    assert view.code_blocks == (first, second)


# Colours of origins


def test_colours_of_segments_land_on_the_rendered_characters(qtbot: QtBot) -> None:
    view = _view(qtbot)
    segments: tuple[Segment, ...] = (
        (T, "Plain "),
        (D, "**bo"),
        (C, "ld** "),
        (T, "end\n\n```python\n"),
        (B, "x = 1\n"),
        (L, "y = 2\n```\n"),
    )
    content = "".join(t for _, t in segments)
    view.show_messages([_message(1, "assistant", content, segments)])
    draft, correction = ORIGIN_COLORS[D], ORIGIN_COLORS[C]
    assert _backgrounds(view, "Plain") == [None] * 5
    assert _backgrounds(view, "bold end") == [draft] * 2 + [correction] * 3 + [None] * 3
    assert _backgrounds(view, "x = 1") == [ORIGIN_COLORS[B]] * 5  # inside the code block
    assert _backgrounds(view, "y = 2") == [ORIGIN_COLORS[L]] * 5
    assert _backgrounds(view, "Copy · python") == [None] * 13
    # The highlighting stays under the colours.
    assert _format(view, _position(view, "1")).foreground().color() != QColor("black")


def test_colour_off_leaves_no_backgrounds(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.colour = False
    pieces = re.findall(r"\s*\S+", "Some **bold** words\n\n```python\nx = [1, 2]\n```\n\nend")
    segments = tuple(_segments(pieces))
    view.show_messages([_message(1, "assistant", "".join(pieces), segments)])
    view.begin_reply()
    view.append_segments(_segments(["streamed ", "**text**", "\n\n", "more"]))
    origin_colours = {c.rgba() for c in ORIGIN_COLORS.values()}
    coloured = [
        text
        for _, text, fmt in _fragments(view)
        if fmt.hasProperty(fmt.Property.BackgroundBrush)
        and fmt.background().color().rgba() in origin_colours
    ]
    assert coloured == []
    view.colour = True
    view.show_messages([_message(1, "assistant", "".join(pieces), segments)])
    assert _backgrounds(view, "Some") == [ORIGIN_COLORS[D]] * 4


# Streaming


def _long_reply() -> list[str]:
    block = (
        "A paragraph with **bold** words and `code` in it, long enough to wrap a line.\n\n"
        "- first item\n- second item\n\n"
        "```python\nfor i in range(3):\n    print(i)\n```\n\n"
    )
    return re.findall(r"\s*\S{1,5}|\s+", block * 12 + "The end.")


def test_streaming_rerenders_only_the_reply(qtbot: QtBot, monkeypatch: pytest.MonkeyPatch) -> None:
    view = _view(qtbot)
    earlier = [
        _message(1, "user", "Explain **this**"),
        _message(2, "assistant", "Sure:\n\n```sh\nls -la\n```\n\nDone.", stats=Stats()),
    ]
    view.show_messages(earlier)
    doc = view.document()
    block = doc.begin()
    while block.isValid():
        block.setUserState(7)  # a block built again would lose it
        block = block.next()
    before = view.toPlainText()
    rendered: list[str] = []
    render = render_markdown  # the function transcript_writer imported

    def spy(text: str, *args: object, **kwargs: object) -> object:
        rendered.append(text)
        return render(text, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(transcript_module, "render_markdown", spy)
    view.begin_reply()
    start = view.reply_start
    assert start is not None and start == len(before) + 1
    changes: list[int] = []
    doc.contentsChange.connect(lambda pos, _removed, _added: changes.append(pos))
    pieces = _long_reply()
    segments = _segments(pieces)
    for i in range(0, len(segments), 3):
        view.append_segments(segments[i : i + 3])
        if i == 60:  # the first paragraph is complete: it shows as Markdown already
            reply_text = view.toPlainText()[start:]
            assert "A paragraph with bold words" in reply_text
            assert "**bold**" not in reply_text.split("\n")[1]
    full = "".join(pieces)
    streamed = list(rendered)
    assert len(streamed) >= 12  # rendered block by block...
    assert max(map(len, streamed)) < len(full) / 10  # ...never the whole reply
    # Nor any part twice, but for an open code fence: it renders again with each line.
    assert sum(len(t) for t in streamed if "```" not in t) < len(full)
    view.end_reply(message_id=3)
    assert rendered[len(streamed) :] == [full]  # the whole reply once, at the end

    assert min(changes) >= start
    assert view.toPlainText()[: start - 1] == before
    block = doc.begin()
    while block.isValid() and block.position() < start:
        assert block.userState() == 7, block.text()
        block = block.next()
    # The reply ends as it shows when the conversation is shown again.
    again = _view(qtbot)
    again.show_messages([*earlier, _message(3, "assistant", full, tuple(segments))])
    assert view.toPlainText() == again.toPlainText()
    assert _blocks(view) == _blocks(again)
    assert view.code_blocks == again.code_blocks
    assert _backgrounds(view, "The end.")[:3] == _backgrounds(again, "The end.")[:3]
    assert view.reply_start is None


def test_streamed_text_keeps_its_colours_before_and_after_rendering(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.begin_reply()
    view.append_segments([(D, "Some "), (C, "**bold**"), (None, " text")])
    assert _backgrounds(view, "Some") == [ORIGIN_COLORS[D]] * 4
    assert _backgrounds(view, "**bold**") == [ORIGIN_COLORS[C]] * 8  # not a block yet
    view.append_segments([(None, "\n\n"), (B, "next")])
    assert _backgrounds(view, "bold text") == [ORIGIN_COLORS[C]] * 4 + [None] * 5
    assert _backgrounds(view, "next") == [ORIGIN_COLORS[B]] * 4
    view.end_reply()
    assert _backgrounds(view, "Some bold") == [ORIGIN_COLORS[D]] * 5 + [ORIGIN_COLORS[C]] * 4


def test_streamed_blocks_keep_their_own_formats(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.begin_reply()
    for text in ("Intro\n\n", "## Part two\n\n", "Text"):
        view.append_segments([(None, text)])
    # Each part renders on its own, its first block included.
    heading = view.document().findBlock(_position(view, "Part two"))
    assert heading.blockFormat().headingLevel() == 2
    assert "##" not in view.toPlainText()


def test_block_splitter_cuts_after_blank_lines_outside_fences() -> None:
    splitter = BlockSplitter()
    text = "Intro\n\n```\ncode\n\nmore\n```\nafter\n\n"
    cuts = [(splitter.feed(text[i : i + 3]), splitter.in_fence) for i in range(0, len(text), 3)]
    offsets = sorted({c for c, fenced in cuts if c is not None and not fenced})
    assert offsets == [text.index("```\ncode"), text.index("after"), len(text)]
    assert not splitter.in_fence
    # Inside the fence the cuts are provisional: the code renders with the fence closed.
    assert any(fenced for c, fenced in cuts if c is not None)
    assert splitter.close_fence("x") == "x"


def test_align_maps_rendered_text_to_its_source() -> None:
    source = "- **Bold** and [link](http://x.org/and) and\n\n```py\nx\n```"
    rendered = render_markdown(source)
    shown = "Bold and link and\nx"
    matches = align(source, shown, rendered.hidden)
    assert "".join(source[i] if i >= 0 else "?" for i in matches) == shown
    assert matches[-1] == source.rindex("x")  # not the "x" of the URL
    assert matches[shown.index("and", 10)] == source.rindex("and")


# Footer of actions


def test_each_footer_link_emits_its_signal_with_the_message_id(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.show_messages(
        [
            _message(11, "user", "Hello"),
            _message(12, "assistant", "Hi!", stats=Stats(), finish_reason="cancelled"),
            _message(13, "assistant", "No stats here."),
        ]
    )
    lines = _lines(view)
    assert lines[2] == "Edit · Copy · Delete"
    assert lines[5] == "Stopped.  Copy · Regenerate · Delete · Stats…"
    assert lines[8] == "Copy · Regenerate · Delete"
    emitted: list[tuple[str, int]] = []
    for name in ("edit", "copy", "regenerate", "delete", "stats"):
        signal = getattr(view, f"{name}_requested")
        signal.connect(lambda mid, name=name: emitted.append((name, mid)))
    for text, nth in (("Edit", 0), ("Copy", 0), ("Delete", 0), ("Copy", 1), ("Regenerate", 0)):
        view.anchorClicked.emit(QUrl(_href(view, text, nth)))
    view.anchorClicked.emit(QUrl(_href(view, "Delete", 1)))
    view.anchorClicked.emit(QUrl(_href(view, "Stats…")))
    view.anchorClicked.emit(QUrl(_href(view, "Regenerate", 1)))
    assert emitted == [
        ("edit", 11),
        ("copy", 11),
        ("delete", 11),
        ("copy", 12),
        ("regenerate", 12),
        ("delete", 12),
        ("stats", 12),
        ("regenerate", 13),
    ]
    # Small and unobtrusive: placeholder colour, links in the palette's link colour.
    palette = view.palette()
    footer = _position(view, "Edit · Copy")
    assert _format(view, footer + 4).foreground().color() == palette.placeholderText().color()
    assert _format(view, footer).foreground().color() == palette.link().color()
    assert _format(view, footer).fontPointSize() < view.font().pointSizeF()


def test_branch_switcher_emits_the_message_id_and_direction(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.show_messages(
        [_message(21, "user", "Question"), _message(22, "assistant", "Answer")],
        {21: (1, 2), 22: (2, 3)},
    )
    lines = [line.replace("\u2002", "") for line in _lines(view)]
    assert lines[2] == "‹ 1/2 ›   Edit · Copy · Delete"
    assert lines[5] == "‹ 2/3 ›   Copy · Regenerate · Delete"
    arrows = [(text.strip(), href) for text, href in _links(view) if text.strip() in "‹›"]
    assert [text for text, _ in arrows] == ["›", "‹", "›"]  # the first of two has no previous
    emitted: list[tuple[int, int]] = []
    view.branch_requested.connect(lambda mid, delta: emitted.append((mid, delta)))
    for _, href in arrows:
        view.anchorClicked.emit(QUrl(href))
    assert emitted == [(21, 1), (22, -1), (22, 1)]


def test_copied_text_leaves_out_the_footers_and_code_headers(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.show_messages(
        [
            _message(31, "user", "Question"),
            _message(32, "assistant", "Answer:\n\n```python\nx = 1\n```", stats=Stats()),
        ],
        {32: (2, 3)},
    )
    view.selectAll()
    mime = view.createMimeDataFromSelection()
    text = mime.text()
    assert "Question" in text and "Answer:" in text and "x = 1" in text
    for chrome in ("Copy", "Regenerate", "Delete", "Stats…", "2/3", "\u2002"):
        assert chrome not in text, chrome
    assert "Regenerate" not in mime.html() and "Answer:" in mime.html()
    # A selection within one message copies just its own words.
    cursor = view.document().find("Answer")
    view.setTextCursor(cursor)
    assert view.createMimeDataFromSelection().text() == "Answer"


def test_end_reply_adds_the_footer(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.append_message("user", "Hi", message_id=1)
    view.begin_reply()
    view.append_segments([(D, "Hello "), (None, "there")])
    view.end_reply("Stopped.", stats_id=2, message_id=2)
    assert _lines(view)[-1] == "Stopped.  Copy · Regenerate · Delete · Stats…"
    assert _format(view, _position(view, "Stopped.")).fontItalic()
    with qtbot.waitSignal(view.regenerate_requested) as blocker:
        view.anchorClicked.emit(QUrl(_href(view, "Regenerate")))
    assert blocker.args == [2]
    with qtbot.waitSignal(view.stats_requested) as blocker:
        view.anchorClicked.emit(QUrl(_href(view, "Stats…")))
    assert blocker.args == [2]
    # Without a message id: the note and the Stats link, as before.
    view.begin_reply()
    view.append_text("Again")
    view.end_reply("", 5)
    assert view.toPlainText().endswith("\nAgain\nStats…")
    assert _href(view, "Stats…", 1) == "stats:5"


def test_code_style_follows_light_and_dark(qtbot: QtBot) -> None:
    view = _view(qtbot)
    content = "```python\ndef f():\n    pass\n```"
    view.show_messages([_message(1, "assistant", content)])
    light = _format(view, _position(view, "def")).foreground().color()
    dark = QPalette()
    for role, colour in (
        (QPalette.ColorRole.Window, "#1e1e1e"),
        (QPalette.ColorRole.Base, "#151515"),
        (QPalette.ColorRole.AlternateBase, "#262626"),
        (QPalette.ColorRole.Text, "#e6e6e6"),
    ):
        dark.setColor(role, QColor(colour))
    view.setPalette(dark)
    view.show_messages([_message(1, "assistant", content)])
    keyword = _format(view, _position(view, "def")).foreground().color()
    assert keyword != light and keyword.lightnessF() > 0.5  # readable on a dark background
    block = view.document().findBlock(_position(view, "def"))
    assert block.blockFormat().background().color() == QColor("#262626")


def test_highlight_message_scrolls_to_it_and_marks_it_until_the_view_changes(
    qtbot: QtBot,
) -> None:
    view = _view(qtbot)
    view.show()
    long = "Words and more words. " * 60
    messages = [_message(i, "user" if i % 2 else "assistant", f"{i}: {long}") for i in range(1, 9)]
    view.show_messages(messages)
    assert view.highlight_message(3)
    [mark] = view.extraSelections()
    assert "3: Words" in mark.cursor.selectedText() and "4: Words" not in mark.cursor.selectedText()
    top = QTextCursor(view.document())
    top.setPosition(mark.cursor.selectionStart())
    assert view.viewport().rect().contains(view.cursorRect(top).topLeft())  # its start in view
    assert not view.highlight_message(99)  # not shown: nothing changes
    assert view.highlighted_message == 3
    view.show_messages(messages[:2])
    assert view.highlighted_message is None and view.extraSelections() == []


def test_how_far_the_prompt_is_read_shows_until_the_first_text(qtbot: QtBot) -> None:
    from app.engine.types import Reading
    from app.ui.transcript_style import reading_note

    view = _view(qtbot)
    view.append_message("user", "Hello", message_id=1)
    view.begin_reply()
    view.show_reading(reading_note(Reading(0, 1_204, 0)))
    view.show_reading(reading_note(Reading(1_536, 3_840, 1_024)))  # replaces the last
    assert view.toPlainText().endswith("Tandem\nReading 3,840 tokens… 40 % · 1,024 reused")
    view.append_segments([(D, "Hi "), (C, "there")])
    assert view.toPlainText().endswith("Tandem\nHi there")
    view.show_reading("Reading 9 tokens… 0 %")  # once text came, too late to say
    view.end_reply(message_id=2)
    assert "Reading" not in view.toPlainText()


def test_a_saved_reply_cut_by_the_token_limit_says_which_limit(qtbot: QtBot) -> None:
    view = _view(qtbot)
    cut = Stats(tokens=1024)
    view.show_messages([_message(1, "assistant", "Long…", stats=cut, finish_reason="length")])
    assert (
        _lines(view)[-1] == "Stopped at the 1,024-token limit.  Copy · Regenerate · Delete · Stats…"
    )
    assert _format(view, _position(view, "Stopped at")).fontItalic()  # muted, as "Stopped."


def _arrow_rect(view: TranscriptView, href: str):  # type: ignore[no-untyped-def]
    """The viewport rectangle of the branch arrow linking to ``href``."""
    from PySide6.QtCore import QRect

    [(pos, text)] = [(p, t) for p, t, f in _fragments(view) if f.anchorHref() == href]
    cursor = QTextCursor(view.document())
    cursor.setPosition(pos)
    left = view.cursorRect(cursor)
    cursor.setPosition(pos + len(text))
    right = view.cursorRect(cursor)
    return QRect(left.topLeft(), right.bottomRight())


def test_branch_arrows_are_large_enough_to_hit_and_show_a_hover_state(qtbot: QtBot) -> None:
    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtGui import QMouseEvent
    from PySide6.QtWidgets import QApplication

    view = _view(qtbot)
    view.show()
    view.show_messages([_message(21, "user", "Question")], {21: (1, 2)})
    href = _href(view, "\u2002›\u2002")
    rect = _arrow_rect(view, href)
    assert rect.width() >= 20 and rect.height() >= 20, rect
    assert view.anchorAt(rect.center()) == href
    # Hovering tints the arrow; leaving takes the tint away.
    move = QMouseEvent(
        QEvent.Type.MouseMove,
        rect.center(),
        view.viewport().mapToGlobal(rect.center()),
        Qt.MouseButton.NoButton,
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(view.viewport(), move)
    assert view.hovered_branch == href
    [hover] = view.extraSelections()
    assert hover.cursor.selectedText() == "\u2002›\u2002"
    assert hover.format.background().color() == view.palette().color(QPalette.ColorRole.Mid)
    away = QMouseEvent(
        QEvent.Type.MouseMove,
        QPoint(1, 1),
        view.viewport().mapToGlobal(QPoint(1, 1)),
        Qt.MouseButton.NoButton,
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(view.viewport(), away)
    assert view.hovered_branch is None and view.extraSelections() == []


LONG_EDIT = " ".join(["a long line of words that must wrap inside the editor"] * 16)


def test_begin_edit_lays_a_wrapping_editor_over_the_message(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.show()
    view.show_messages(
        [_message(1, "user", "Short question"), _message(2, "assistant", "An answer.")]
    )
    assert view.begin_edit(1, "Short question")
    editor = view.editor
    assert editor.isVisible() and view.editing_message == 1
    assert editor.text() == "Short question" and view.focusWidget() is editor.field
    # Over the message's text, below its "You" label, as wide as the text.
    label = view.document().findBlock(0)
    label_bottom = view.document().documentLayout().blockBoundingRect(label).bottom()
    assert label_bottom - 1 <= editor.y() < label_bottom + 8
    assert editor.width() > view.viewport().width() - 40
    small = editor.height()
    answer = view.document().find("An answer.")
    answer_top = view.cursorRect(answer).top()
    assert editor.geometry().bottom() < answer_top  # room was made: the reply shows
    # Long text wraps (no sideways scrolling) and the editor grows, within a limit.
    editor.field.setPlainText(LONG_EDIT)
    assert not editor.field.horizontalScrollBar().isVisible()
    assert editor.field.horizontalScrollBar().maximum() == 0
    assert editor.height() > small + 2 * editor.field.fontMetrics().lineSpacing()
    assert editor.geometry().bottom() < view.cursorRect(view.document().find("An answer.")).top()
    editor.field.setPlainText(LONG_EDIT * 10)
    assert editor.height() < 400
    view.resize(700, 150)  # the editor is kept over its message as the view scrolls
    view.verticalScrollBar().setValue(30)
    assert view.verticalScrollBar().value() == 30
    assert editor.y() == int(
        view.document().documentLayout().blockBoundingRect(label.next()).top() - 30
    )


def test_esc_cancels_the_edit_and_leaves_the_view_as_it_was(qtbot: QtBot) -> None:
    from PySide6.QtCore import Qt

    view = _view(qtbot)
    view.show()
    view.show_messages([_message(1, "user", "Hello"), _message(2, "assistant", "Hi.")])
    before = view.toHtml()
    view.begin_edit(1, "Hello")
    qtbot.keyClicks(view.editor.field, " there")
    with qtbot.waitSignal(view.edit_cancelled) as cancelled:
        qtbot.keyClick(view.editor.field, Qt.Key.Key_Escape)
    assert cancelled.args == [1]
    assert not view.editor.isVisible() and view.editing_message is None
    assert view.toHtml() == before  # the room made for the editor is given back


def test_an_unsaved_edit_comes_back_with_its_message(qtbot: QtBot) -> None:
    from PySide6.QtCore import Qt

    view = _view(qtbot)
    view.show()
    chat = [_message(1, "user", "Hello"), _message(2, "assistant", "Hi.")]
    view.show_messages(chat)
    view.begin_edit(1, "Hello")
    qtbot.keyClicks(view.editor.field, " there")
    # Another chat is shown, then this one again: the typed text is not lost.
    view.show_messages([_message(5, "user", "Other")])
    assert view.editing_message is None and not view.editor.isVisible()
    view.show_messages(chat)
    assert view.editing_message == 1 and view.editor.text() == "Hello there"
    # A cancelled edit is gone for good; an unchanged one leaves nothing behind.
    qtbot.keyClick(view.editor.field, Qt.Key.Key_Escape)
    view.show_messages(chat)
    assert view.editing_message is None
    view.begin_edit(1, "Hello")
    view.show_messages(chat)
    assert view.editing_message is None


def test_ctrl_return_submits_the_edit_as_typed(qtbot: QtBot) -> None:
    from PySide6.QtCore import Qt

    view = _view(qtbot)
    view.show()
    view.show_messages([_message(1, "user", "Hello")])
    assert not view.begin_edit(7, "not shown")
    view.begin_edit(1, "Hello")
    qtbot.keyClicks(view.editor.field, " there")
    with qtbot.waitSignal(view.edit_submitted) as submitted:
        qtbot.keyClick(view.editor.field, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert submitted.args == [1, "Hello there"]
    with qtbot.waitSignal(view.edit_submitted) as clicked:
        view.editor.save_button.click()
    assert clicked.args == [1, "Hello there"]
    view.show_messages([_message(1, "user", "Hello there")])  # another view: no editor
    assert not view.editor.isVisible() and view.editing_message is None


# Reasoning


def _quoted(view: TranscriptView, text: str) -> bool:
    """Whether the block holding ``text`` is set in (a blockquote's indent) and italic."""
    position = _position(view, text)
    block = view.document().findBlock(position)
    return block.blockFormat().leftMargin() > 0 and _format(view, position).fontItalic()


def test_a_models_reasoning_streams_set_in_under_one_label_its_tags_hidden(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.begin_reply()
    pieces = ["<think>\nFirst ", "thought.\n\n", "Second ", "thought.\n", "</think>\n\n", "Four."]
    for piece in pieces:
        view.append_segments([(D, piece)])
    # Cut inside the reasoning: its second part renders as reasoning going on, unlabelled.
    assert _quoted(view, "First thought.") and _quoted(view, "Second thought.")
    assert view.toPlainText().count("Thinking") == 1
    view.end_reply(message_id=1)
    text = view.toPlainText()
    assert "<think>" not in text and "</think>" not in text
    assert text.count("Thinking") == 1
    assert _quoted(view, "Second thought.") and not _quoted(view, "Four.")
    assert _backgrounds(view, "Four.") == [ORIGIN_COLORS[D]] * 5  # colours still land
    assert _backgrounds(view, "Thinking") == [None] * 8


def test_a_reply_whose_prompt_opened_its_reasoning_and_gpt_oss_channels(qtbot: QtBot) -> None:
    view = _view(qtbot)
    harmony = (
        "<|channel|>analysis<|message|>Add them.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Four."
    )
    opened = "Add them.\n</think>\n\nFour."  # the prompt ended with "<think>\n"
    view.show_messages([_message(1, "assistant", opened), _message(2, "assistant", harmony)])
    text = view.toPlainText()
    assert text.count("Thinking") == 2 and "<|" not in text and "</think>" not in text
    assert _quoted(view, "Add them.") and not _quoted(view, "Four.")


def test_thoughts_the_prompt_opened_turn_into_thoughts_when_their_closing_tag_streams(
    qtbot: QtBot,
) -> None:
    view = _view(qtbot)
    view.begin_reply()
    for piece in ["First thought.\n\n", "Second ", "thought.\n", "</think>\n\n", "Four", "."]:
        view.append_segments([(D, piece)])
    # Rendered as an answer until the tag came; then the reply rendered again from its start.
    assert _quoted(view, "First thought.") and _quoted(view, "Second thought.")
    assert view.toPlainText().count("Thinking") == 1 and "</think>" not in view.toPlainText()
    view.append_segments([(D, "\n\nMore answer.\n\n")])
    assert not _quoted(view, "More answer.")
    view.end_reply(message_id=1)
    assert _quoted(view, "First thought.") and not _quoted(view, "Four.")
    assert _backgrounds(view, "Four.") == [ORIGIN_COLORS[D]] * 5


def test_an_answer_that_quotes_the_tags_in_code_is_no_reasoning(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.begin_reply()
    pieces = ["Reasoning models write:\n\n", "```\n<think>\n", "plan\n</think>\n```\n\n", "Done."]
    for piece in pieces:
        view.append_segments([(None, piece)])
    view.end_reply(message_id=1)
    assert "Thinking" not in view.toPlainText()
    assert "</think>" in view.toPlainText() and not _quoted(view, "Done.")


def _shown(view: TranscriptView, text: str) -> bool:
    return view.document().findBlock(_position(view, text)).isVisible()


def _click_label(qtbot: QtBot, view: TranscriptView, nth: int = 0) -> None:
    """Clicks the nth reasoning label's link with the mouse, as a user does."""
    from PySide6.QtCore import Qt

    [pos, *_] = [p for p, _, f in _fragments(view) if f.anchorHref() == "fold:"][nth:]
    cursor = QTextCursor(view.document())
    cursor.setPosition(pos + 3)
    qtbot.mouseClick(
        view.viewport(), Qt.MouseButton.LeftButton, pos=view.cursorRect(cursor).center()
    )


REASONED = "<think>\nFirst thought.\n\n```\nplan()\n```\n</think>\n\n- Four.\n- Five."


def test_stored_reasoning_shows_folded_and_its_label_opens_and_folds_it(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.show()
    view.show_messages(
        [_message(1, "assistant", REASONED), _message(2, "user", "And?")], {1: (1, 2)}
    )
    height, length = view.document().size().height(), view.document().characterCount()
    label = view.document().findBlock(_position(view, "Thinking"))
    assert label.text() == "▸ Thinking"
    assert not _shown(view, "First thought.") and not _shown(view, "plan()")
    # The answer (a list), the footer and the next message stay.
    assert _shown(view, "Four.") and _shown(view, "Five.") and _shown(view, "Regenerate")
    assert _shown(view, "And?")
    _click_label(qtbot, view)
    assert _shown(view, "First thought.") and _shown(view, "plan()")
    assert view.document().findBlock(_position(view, "Thinking")).text() == "▾ Thinking"
    assert view.document().size().height() > height
    _click_label(qtbot, view)
    assert not _shown(view, "First thought.") and view.document().size().height() == height
    # Only a mark changed: the positions the view keeps of its messages hold.
    assert view.document().characterCount() == length
    assert view.highlight_message(2)


def test_a_streamed_replys_reasoning_stays_open_until_it_ends(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.show()
    view.begin_reply()
    for piece in ["<think>\nFirst ", "thought.\n\n", "Second.\n", "</think>\n\n", "Four."]:
        view.append_segments([(D, piece)])
    # While it streams, its label is no link: the text under it is still coming.
    assert "fold:" not in [href for _, href in _links(view)]
    assert view.toPlainText().count("Thinking") == 1
    view.end_reply(message_id=1)
    assert not _shown(view, "First thought.") and not _shown(view, "Second.")
    assert _shown(view, "Four.") and _backgrounds(view, "Four.") == [ORIGIN_COLORS[D]] * 5
    _click_label(qtbot, view)
    assert _shown(view, "First thought.")


def test_a_reply_stopped_while_thinking_folds_only_its_own_thoughts(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.show_messages([_message(1, "assistant", "<think>\nHalf a thought", finish_reason="stop")])
    view.append_message("user", "Go on")
    assert not _shown(view, "Half a thought") and _shown(view, "Go on")
    # A reply that ends with no footer (not saved): the next message's header bounds it.
    view.begin_reply()
    view.append_segments([(None, "<think>\nAnother half")])
    view.end_reply()
    view.append_message("user", "Still there?")
    view.show()
    _click_label(qtbot, view, 1)
    assert _shown(view, "Another half")
    _click_label(qtbot, view, 1)
    assert not _shown(view, "Another half") and _shown(view, "Still there?")


def test_copied_text_leaves_out_folded_thoughts_and_the_label(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.show()
    view.show_messages([_message(1, "assistant", REASONED)])
    view.selectAll()
    text = view.createMimeDataFromSelection().text()
    assert "Four." in text and "First thought." not in text and "Thinking" not in text
    _click_label(qtbot, view)
    view.selectAll()
    text = view.createMimeDataFromSelection().text()
    assert "Four." in text and "First thought." in text and "Thinking" not in text


def test_folding_a_replys_thoughts_as_it_ends_keeps_the_text_read_in_place(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.resize(500, 200)
    view.show()
    thoughts = "".join(f"Thought {i}.\n\n" for i in range(30))
    answer = "".join(f"Answer line {i}.\n\n" for i in range(30))
    view.begin_reply()
    view.append_segments([(None, f"<think>\n{thoughts}</think>\n\n{answer}")])
    line = QTextCursor(view.document().findBlock(_position(view, "Answer line 5.")))
    bar = view.verticalScrollBar()
    bar.setValue(bar.value() + view.cursorRect(line).top())  # the reader is at line 5
    before = view.cursorRect(line).top()
    assert bar.value() < bar.maximum() - 4
    view.end_reply(message_id=1)
    assert not _shown(view, "Thought 3.")
    line = QTextCursor(view.document().findBlock(_position(view, "Answer line 5.")))
    assert abs(view.cursorRect(line).top() - before) <= 4
