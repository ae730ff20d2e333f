"""Markdown of replies as HTML that QTextDocument understands, and what colours it.

Qt-free: the transcript inserts the HTML, then uses :func:`align` to find which
source characters each rendered character came from, so the colours of token
origins survive rendering. While a reply streams, :class:`BlockSplitter` says
where its text can be cut into parts that render on their own.

QTextDocument reads a subset of HTML 4 and CSS: everything here is inline
styles on plain elements, without classes or scripts.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

from app.store import reasoning

COPY_SCHEME = "copy"
# Heads a reply's reasoning; a line of chrome, coloured by no token. Its link folds the
# reasoning away and opens it again (the transcript's: :mod:`app.ui.transcript_folds`).
REASONING_LABEL = "Thinking"
FOLD_SCHEME = "fold"
OPEN_MARK, FOLDED_MARK = "▾", "▸"
# Block states (``QTextBlock.userState``) that bound a reply's reasoning in the document:
# its label's line, and the first line of an answer after it.
LABEL_STATE, ANSWER_STATE = 1, 2
_BLOCK_TAG = re.compile(r"<(p|pre|h[1-6]|li|blockquote|td|th)\b([^>]*)>")
LIGHT_STYLE = "default"
DARK_STYLE = "github-dark"


@dataclass(frozen=True, slots=True)
class Theme:
    """Colours and fonts of rendered Markdown, taken from the palette by the caller.

    Attributes:
        dark: Whether the background is dark; picks the Pygments style.
        code_background: Background of code blocks and inline code (CSS colour).
        muted: Colour of secondary text such as a code block's language.
        link: Colour of links.
        mono_family: CSS ``font-family`` of code.
        rule: Colour of table borders.
    """

    dark: bool = False
    code_background: str = "#f3f3f3"
    muted: str = "#8e8e93"
    link: str = "#0a64d6"
    mono_family: str = "monospace"
    rule: str = "#c8c8c8"


@dataclass(frozen=True, slots=True)
class Rendered:
    """Markdown rendered to HTML.

    Attributes:
        html: The HTML fragment.
        code_blocks: Raw text of each fenced or indented code block, in order; the
            block's Copy link is ``copy:<first_code_index + i>``.
        hidden: Source ranges ``(start, end)`` never shown, such as fence lines;
            :func:`align` does not match rendered text there.
    """

    html: str
    code_blocks: tuple[str, ...] = ()
    hidden: tuple[tuple[int, int], ...] = field(default=())


def render_markdown(
    text: str,
    theme: Theme | None = None,
    first_code_index: int = 0,
    thinking: bool = False,
    begins: bool = True,
    foldable: bool = True,
) -> Rendered:
    """Renders CommonMark with GFM tables and strikethrough to QTextDocument HTML.

    Raw HTML in ``text`` is shown as text. Single newlines break lines, as chat
    replies expect. Images show as links, so the view never loads a file or URL.
    A reasoning model's thoughts (:mod:`app.store.reasoning`) show set in, muted, under
    :data:`REASONING_LABEL`, their markup hidden.

    Args:
        text: The Markdown source.
        theme: Colours and fonts; light defaults when ``None``.
        first_code_index: Index of this text's first code block among all the
            code blocks of the document, for unique Copy links.
        thinking: Whether ``text`` continues reasoning begun before it (no label then).
        begins: Whether ``text`` begins the reply, where a ``<think>`` may open reasoning.
        foldable: Whether the reasoning's label is the link that folds it (not while the
            reply streams: its text after the label is still coming).
    """
    theme = theme or Theme()
    if not reasoning.has_reasoning(text, thinking, begins):
        return _render(text, theme, first_code_index)
    html_parts: list[str] = []
    code: list[str] = []
    hidden: list[tuple[int, int]] = []
    opened = not thinking  # a label where reasoning starts, not where it goes on
    for part in reasoning.parts(text, thinking, begins):
        if part.kind == "markup":
            hidden.append((part.start, part.end))
            opened = True
            continue
        source = text[part.start : part.end]
        if not source.strip():
            continue
        rendered = _render(source, theme, first_code_index + len(code))
        code += rendered.code_blocks
        hidden += [(a + part.start, b + part.start) for a, b in rendered.hidden]
        if part.kind == "reasoning":
            label = _label(theme, foldable) if opened else ""
            style = f"color:{theme.muted}; font-style:italic"
            html_parts.append(f'<blockquote style="{style}">{label}{rendered.html}</blockquote>')
        else:
            html_parts.append(_in_state(rendered.html, ANSWER_STATE))
        opened = False
    return Rendered("\n".join(html_parts), tuple(code), tuple(sorted(hidden)))


def _label(theme: Theme, foldable: bool) -> str:
    """The line that heads reasoning: where ``foldable``, a link that folds it."""
    block = f'<p style="-qt-user-state:{LABEL_STATE}">'
    if not foldable:
        return f"{block}<b>{REASONING_LABEL}</b></p>"
    link = f"color:{theme.muted}; text-decoration:none; font-weight:bold"
    text = f"{OPEN_MARK} {REASONING_LABEL}"
    return f'{block}<a href="{FOLD_SCHEME}:" style="{link}">{text}</a></p>'


def _in_state(html_text: str, state: int) -> str:
    """``html_text`` with its first block in the block state ``state``."""

    def add(m: re.Match[str]) -> str:
        tag, attributes = m.group(1), m.group(2)
        style = f"-qt-user-state:{state};"
        if 'style="' in attributes:
            attributes = attributes.replace('style="', f'style="{style} ', 1)
        else:
            attributes += f' style="{style}"'
        return f"<{tag}{attributes}>"

    return _BLOCK_TAG.sub(add, html_text, count=1)


def _render(text: str, theme: Theme, first_code_index: int) -> Rendered:
    env: dict[str, Any] = {"theme": theme, "code": [], "first": first_code_index}
    md = _parser()
    tokens = md.parse(text, env)
    body = md.renderer.render(tokens, md.options, env)
    # A line break after the last block would show as a trailing space.
    return Rendered(body.rstrip("\n"), tuple(env["code"]), _hidden_ranges(text, tokens))


def highlight_code(code: str, language: str, dark: bool) -> str:
    """``code`` as HTML spans with inline colours, to go inside ``<pre>``."""
    out: str = highlight(code, _lexer(language), _formatter(dark))
    return out[:-1] if out.endswith("\n") and not code.endswith("\n") else out


def align(source: str, rendered: str, hidden: Sequence[tuple[int, int]] = ()) -> list[int]:
    """Index in ``source`` of each character of ``rendered``, or -1 where none is.

    Rendering Markdown drops syntax (``**``, list markers, fences, pipes) and
    keeps the text in order, so a walk through both that looks a little ahead
    in the source finds each rendered run. Whole runs of non-space text anchor
    the walk; single characters may only skip a few source characters, so a
    stray one never drags the walk far ahead. Linear in the text's length.

    Args:
        source: The Markdown source.
        rendered: The rendered plain text.
        hidden: Source ranges that are never shown.
    """
    search = _masked(source, hidden)
    out = [-1] * len(rendered)
    n = len(search)
    ranges = sorted(hidden)
    h = 0  # the first hidden range that may lie at or after ``i``
    i = 0

    def shown(i: int) -> int:
        """``i``, or the end of the hidden source that starts there."""
        nonlocal h
        while h < len(ranges) and ranges[h][1] <= i:
            h += 1
        while h < len(ranges) and ranges[h][0] <= i:
            i = ranges[h][1]
            h += 1
        return i

    def find(text: str, i: int, reach: int) -> int:
        base = shown(i)
        return search.find(text, base, base + reach + len(text))

    for m in _RUN.finditer(rendered):
        run, start = m.group(), m.start()
        if run[0].isspace():
            for k in range(len(run)):
                j, skipped = shown(i), 0
                while j < n and (search[j] == "\0" or (search[j] in _SYNTAX and skipped < 8)):
                    skipped += search[j] != "\0"
                    j += 1
                if j < n and search[j].isspace():
                    out[start + k] = j
                    i = j + 1
            continue
        found = find(run, i, _WINDOW)
        if found >= 0:
            out[start : start + len(run)] = range(found, found + len(run))
            i = found + len(run)
            continue
        for part in _PART.finditer(run):
            piece, offset = part.group(), start + part.start()
            found = find(piece, i, _WINDOW if piece[0].isalnum() or piece[0] == "_" else _CHAR_SKIP)
            if found >= 0:
                out[offset : offset + len(piece)] = range(found, found + len(piece))
                i = found + len(piece)
                continue
            for k, ch in enumerate(piece):  # e.g. "foo_bar" from "foo\_bar"
                found = find(ch, i, _CHAR_SKIP)
                if found >= 0:
                    out[offset + k] = found
                    i = found + 1
    return out


class BlockSplitter:
    """Finds where a streamed Markdown text can be cut into parts that render alone.

    A cut falls after a blank line outside a code fence, or after a closing
    fence. Lists and quotes split there may render a little differently from the
    whole text (numbering is kept), which the final render of the reply repairs.

    Inside a fence not closed yet, every line ends a provisional cut
    (:attr:`in_fence` is then true): the text so far renders as a code block once
    :meth:`close_fence` closes it, and renders again from the same place later.
    A cut inside a model's reasoning says so (:attr:`thinking_at_cut`): the part
    after it renders as reasoning going on.
    """

    def __init__(self) -> None:
        self._partial = ""
        self._offset = 0  # source offset where ``_partial`` starts
        self._fence: str | None = None
        self._thinking = False  # whether the lines fed end inside reasoning
        self.thinking_at_cut = False  # whether the text after the last cut starts inside it

    @property
    def in_fence(self) -> bool:
        return self._fence is not None

    def close_fence(self, source: str) -> str:
        """``source`` with the open fence closed, so that its code shows as code, not as
        "```python" and plain lines, while the reply streams; ``source`` when none is open."""
        if self._fence is None:
            return source
        sep = "" if source.endswith("\n") else "\n"
        return f"{source}{sep}{self._fence}\n"

    def feed(self, text: str) -> int | None:
        """Takes the next streamed text; returns the offset after the last new cut, if any."""
        if "\n" not in text:
            self._partial += text
            return None
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        cut = None
        for line in lines:
            begins = self._offset == 0
            self._offset += len(line) + 1
            self._thinking = reasoning.thinking_after(line, self._thinking, begins)
            stripped = line.strip()
            if self._fence is not None:
                char = self._fence[0]
                if stripped.startswith(self._fence) and stripped == char * len(stripped):
                    self._fence = None
                cut = self._offset
            elif m := _FENCE.match(line):
                self._fence = m.group(1)
                cut = self._offset
            elif not stripped:
                cut = self._offset
            if cut == self._offset:
                self.thinking_at_cut = self._thinking
        return cut


# Characters that Markdown may drop between two shown characters.
_SYNTAX = frozenset("*_~`#>|-+=:![](){}<>\\\0")
_RUN = re.compile(r"\s+|\S+")
_PART = re.compile(r"\w+|\W")
_WINDOW = 1024  # how far a run of text may be from the previous one: a link's URL, a table rule
_CHAR_SKIP = 12  # how far one character of punctuation may be
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_LINE_START = re.compile(r"^", re.MULTILINE)
# "](destination "title")" of an inline link or image.
_LINK_TAIL = re.compile(
    r"\]\((?:<[^>\n]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)"
    r"""(?:\s+(?:"[^"\n]*"|'[^'\n]*'|\([^)\n]*\)))?\s*\)"""
)


def _masked(source: str, hidden: Sequence[tuple[int, int]]) -> str:
    if not hidden:
        return source
    parts: list[str] = []
    last = 0
    for start, end in sorted(hidden):
        start = max(start, last)  # overlapping ranges would shift the text
        parts += [source[last:start], "\0" * max(end - start, 0)]
        last = max(end, last)
    parts.append(source[last:])
    return "".join(parts)


def _hidden_ranges(text: str, tokens: list[Token]) -> tuple[tuple[int, int], ...]:
    """Source never shown: fence lines and the destinations of links.

    Both hold words that also appear in the text, which :func:`align` must not
    match there: ``python`` of a fence, ``docs`` of ``[the docs](https://docs.org)``.
    """
    fences = [t for t in tokens if t.type == "fence" and t.map is not None]
    linked = [
        t
        for t in tokens
        if t.type == "inline"
        and t.map is not None
        and any(c.type in ("link_open", "image") for c in t.children or ())
    ]
    if not fences and not linked:
        return ()
    starts = [m.start() for m in _LINE_START.finditer(text)]
    starts.append(len(text))
    lines = len(starts) - 1

    def line_range(line: int) -> tuple[int, int]:
        return starts[min(line, lines)], starts[min(line + 1, lines)]

    out: list[tuple[int, int]] = []
    for t in fences:
        assert t.map is not None
        first, last = t.map[0], t.map[1] - 1
        out.append(line_range(first))
        if last > first and _FENCE.match(text[slice(*line_range(last))]):
            out.append(line_range(last))
    for t in linked:
        assert t.map is not None
        start, end = line_range(t.map[0])[0], line_range(t.map[1] - 1)[1]
        out += [(m.start(), m.end()) for m in _LINK_TAIL.finditer(text, start, end)]
    return tuple(sorted(out))


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "breaks": True, "linkify": False})
    md.enable(["table", "strikethrough"])
    rules = md.add_render_rule
    rules("fence", _render_fence)
    rules("code_block", _render_fence)
    rules("code_inline", _render_code_inline)
    rules("image", _render_image)
    rules("link_open", _render_link_open)
    rules("table_open", _render_table_open)
    rules("th_open", _render_cell_open)
    rules("td_open", _render_cell_open)
    rules("heading_open", _render_heading_open)
    rules("paragraph_open", _render_paragraph_open)
    return md


def _render_fence(
    self: Any, tokens: Sequence[Token], idx: int, options: Any, env: dict[str, Any]
) -> str:
    token = tokens[idx]
    theme: Theme = env["theme"]
    language = token.info.strip().split(maxsplit=1)[0] if token.info.strip() else ""
    code = token.content.removesuffix("\n")  # the line break before the closing fence
    index = env["first"] + len(env["code"])
    env["code"].append(code)
    label = f" · {html.escape(language)}" if language else ""
    return (
        f'<p style="margin-top:8px; margin-bottom:0px; font-size:small;">'
        f'<a href="{COPY_SCHEME}:{index}" style="color:{theme.link}; text-decoration:none;">'
        f'Copy</a><span style="color:{theme.muted};">{label}</span></p>\n'
        f'<pre style="margin-top:2px; margin-bottom:8px; white-space:pre-wrap;'
        f" font-family:{theme.mono_family}; background-color:{theme.code_background};"
        f'">{highlight_code(code, language, theme.dark)}</pre>\n'
    )


def _render_code_inline(
    self: Any, tokens: Sequence[Token], idx: int, options: Any, env: dict[str, Any]
) -> str:
    theme: Theme = env["theme"]
    return (
        f'<code style="font-family:{theme.mono_family};'
        f' background-color:{theme.code_background};">{html.escape(tokens[idx].content)}</code>'
    )


def _render_image(
    self: Any, tokens: Sequence[Token], idx: int, options: Any, env: dict[str, Any]
) -> str:
    token = tokens[idx]
    alt = self.renderInlineAsText(token.children or [], options, env) or "image"
    src = html.escape(str(token.attrGet("src") or ""))
    theme: Theme = env["theme"]
    return f'<a href="{src}" title="{src}" style="color:{theme.link};">{html.escape(alt)}</a>'


def _render_link_open(
    self: Any, tokens: Sequence[Token], idx: int, options: Any, env: dict[str, Any]
) -> str:
    href = html.escape(str(tokens[idx].attrGet("href") or ""))
    theme: Theme = env["theme"]
    return f'<a href="{href}" title="{href}" style="color:{theme.link};">'


def _render_table_open(
    self: Any, tokens: Sequence[Token], idx: int, options: Any, env: dict[str, Any]
) -> str:
    theme: Theme = env["theme"]
    return (
        f'<table border="1" cellspacing="0" cellpadding="4" style="border-collapse:collapse;'
        f' border-style:solid; border-color:{theme.rule}; margin-top:6px; margin-bottom:6px;">\n'
    )


def _render_cell_open(
    self: Any, tokens: Sequence[Token], idx: int, options: Any, env: dict[str, Any]
) -> str:
    token = tokens[idx]
    tag = token.tag
    align = re.search(r"text-align:(\w+)", str(token.attrGet("style") or ""))
    return f'<{tag} align="{align.group(1)}">' if align else f"<{tag}>"


def _render_heading_open(
    self: Any, tokens: Sequence[Token], idx: int, options: Any, env: dict[str, Any]
) -> str:
    # Qt's headings suit documents; a step smaller suits a chat.
    tag = tokens[idx].tag
    return f'<{tag} style="font-size:{_HEADING_SIZES.get(tag, "medium")};">'


_HEADING_SIZES = {"h1": "x-large", "h2": "large"}


def _render_paragraph_open(
    self: Any, tokens: Sequence[Token], idx: int, options: Any, env: dict[str, Any]
) -> str:
    if tokens[idx].hidden:  # the text of a tight list item
        return ""
    # Closer than Qt's 12px above and below: a reply reads as one piece.
    return '<p style="margin-top:0px; margin-bottom:8px;">'


@lru_cache(maxsize=64)
def _lexer(language: str) -> Lexer:
    # Keep every line of the code: the rendered text must match the source.
    options = {"stripnl": False, "ensurenl": False}
    try:
        return get_lexer_by_name(language.lower(), **options) if language else TextLexer(**options)
    except ClassNotFound:
        return TextLexer(**options)


@lru_cache(maxsize=2)
def _formatter(dark: bool) -> HtmlFormatter:
    return HtmlFormatter(noclasses=True, nowrap=True, style=DARK_STYLE if dark else LIGHT_STYLE)
