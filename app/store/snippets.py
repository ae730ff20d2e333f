"""A search hit's snippet: the words around its match in the text a reader sees.

SQLite's ``snippet()`` cuts the stored text, markup included: a reasoning
reply's hit showed its ``<think>`` tag, and the word "think" matched every such
reply through its tags. The snippet is cut here instead, from a message's text
with its reasoning markup left out (:mod:`app.store.reasoning`), matching words
as the index does (``unicode61``: letters and digits, case and diacritics
folded; each word of a query a prefix, its parts a phrase).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from app.store.reasoning import parts

WIDTH = 16  # tokens a snippet shows
LEAD = 3  # tokens before the first match it starts with, where there are
_TOKEN = re.compile(r"[^\W_]+")


def _fold(text: str) -> str:
    """Case and diacritics folded, as the index folds them."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def phrases(query: str) -> list[list[str]]:
    """Each word of ``query`` as the folded tokens it is made of (words without any dropped)."""
    out = [[_fold(t) for t in _TOKEN.findall(word)] for word in query.split()]
    return [p for p in out if p]


def visible(text: str) -> str:
    """``text`` without its reasoning markup, each run of whitespace one space."""
    shown = " ".join(text[p.start : p.end] for p in parts(text) if p.kind != "markup")
    return " ".join(shown.split())


def _matches(tokens: Sequence[str], phrase: Sequence[str]) -> list[int]:
    """Where ``phrase`` starts in ``tokens``: its tokens in a row, the last a prefix."""
    *whole, prefix = phrase
    n = len(phrase)
    return [
        i
        for i in range(len(tokens) - n + 1)
        if tokens[i : i + n - 1] == whole and tokens[i + n - 1].startswith(prefix)
    ]


def snippet(text: str, query: str) -> str | None:
    """The words of ``text`` around its best match of ``query``, matches marked with «».

    Returns:
        ``None`` where some word of the query is only in the markup: no hit for a reader.
    """
    shown = visible(text)
    spans = [(m.start(), m.end()) for m in _TOKEN.finditer(shown)]
    tokens = [_fold(shown[a:b]) for a, b in spans]
    found = [(p, _matches(tokens, p)) for p in phrases(query)]
    if not found or any(not starts for _, starts in found):
        return None
    marked = {i + j for p, starts in found for i in starts for j in range(len(p))}

    def covered(first: int) -> int:
        window = range(first, first + WIDTH)
        return sum(any(i in window for i in starts) for _, starts in found)

    # A few tokens before a match, or as many as fit before the end.
    firsts = sorted({max(0, min(i - LEAD, len(spans) - WIDTH)) for _, s in found for i in s})
    first = max(firsts, key=lambda f: (covered(f), -f))
    last = min(len(spans), first + WIDTH)
    out = []
    for i in range(first, last):  # one mark for a run of matched tokens (a phrase)
        a, b = spans[i]
        if i > first:
            if i - 1 in marked and i not in marked:
                out.append("»")
            out.append(shown[spans[i - 1][1] : a])
        if i in marked and (i == first or i - 1 not in marked):
            out.append("«")
        out.append(shown[a:b])
    if last - 1 in marked:
        out.append("»")
    head = "…" if first > 0 else shown[: spans[0][0]]
    tail = "…" if last < len(spans) else shown[spans[-1][1] :]
    return head + "".join(out) + tail
