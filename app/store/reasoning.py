"""Where a reply thinks before it answers: its reasoning told apart from its answer.

Qt-free. Reasoning models write their thoughts first, marked up by their chat
format: ``<think>`` … ``</think>`` (Qwen3 / 3.5 / 3.6, DeepSeek-R1, GLM), or
gpt-oss's harmony channels (``<|channel|>analysis<|message|>`` … ``<|end|>``, then
``<|start|>assistant<|channel|>final<|message|>`` before the answer). Newer Qwen
templates open ``<think>`` in the prompt, so such a reply holds only the closing
tag: text before a closing tag with no opening one is reasoning too.

:func:`parts` cuts a reply's source into reasoning, markup and answer; the
transcript renders each part and hides the markup, Copy takes the answer
(:func:`answer_of`) and the Markdown export folds the thoughts (:func:`split`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["reasoning", "markup", "answer"]

# An opening or closing tag, or harmony's other markup: "<|start|>assistant" before a
# channel, a channel with its name, "<|return|>". Group 1: an opener; 2: a closer.
# "<think>" opens only where a reply begins, and "</think>" closes only before a blank
# line or the end, as reasoning models write them: an answer that shows the tags (in
# code, or inline) keeps them as text.
_MARK = re.compile(
    r"(\A\s*<think>|<\|channel\|>(?:analysis|commentary)[^<]*<\|message\|>)"
    r"|(</think>(?=[ \t]*(?:\n[ \t]*\n|\n?[ \t]*\Z))|<\|end\|>)"
    r"|<\|start\|>assistant|<\|channel\|>final[^<]*<\|message\|>|<\|return\|>"
)


@dataclass(frozen=True, slots=True)
class Part:
    """A run of a reply's source, ``[start, end)``, and what it is."""

    kind: Kind
    start: int
    end: int


def _marks(text: str, begins: bool) -> list[re.Match[str]]:
    """The marks of ``text``; a ``<think>`` only where ``text`` ``begins`` the reply."""
    return [m for m in _MARK.finditer(text) if begins or not m.group(1) or "<think>" not in m[1]]


def parts(text: str, thinking: bool = False, begins: bool = True) -> list[Part]:
    """``text`` cut into its reasoning, the markup around it and its answer, in order.

    Args:
        text: A reply's source, or the part of it from some point on.
        thinking: Whether ``text`` starts inside reasoning (its opening came before).
            A closing tag with no opening tag before it says so too.
        begins: Whether ``text`` begins the reply (where ``<think>`` may open).

    Returns:
        One answer part for text with no reasoning in it; empty parts are left out.
    """
    marks = _marks(text, begins)
    if not thinking and marks and marks[0].group(2) is not None:
        thinking = True  # the prompt opened it
    out: list[Part] = []
    at = 0
    for m in marks:
        if m.start() > at:
            out.append(Part("reasoning" if thinking else "answer", at, m.start()))
        out.append(Part("markup", m.start(), m.end()))
        if m.group(1) is not None:
            thinking = True
        elif m.group(2) is not None:
            thinking = False
        at = m.end()
    if at < len(text):
        out.append(Part("reasoning" if thinking else "answer", at, len(text)))
    return out


def opened_before(text: str, begins: bool = True) -> bool:
    """Whether ``text``'s first mark closes reasoning: the prompt, or text before, opened it."""
    marks = _marks(text, begins)
    return bool(marks) and marks[0].group(2) is not None


def thinking_after(text: str, thinking: bool = False, begins: bool = True) -> bool:
    """Whether ``text``, started inside reasoning where ``thinking``, ends inside it."""
    for m in _marks(text, begins):
        if m.group(1) is not None:
            thinking = True
        elif m.group(2) is not None:
            thinking = False
    return thinking


def has_reasoning(text: str, thinking: bool = False, begins: bool = True) -> bool:
    """Whether ``text`` holds any reasoning or its markup (or starts inside reasoning)."""
    return thinking or bool(_marks(text, begins))


def split(text: str) -> tuple[str, str]:
    """A reply's thoughts and its answer, each stripped, their markup left out."""
    cut = parts(text)
    thoughts, answer = (
        "".join(text[p.start : p.end] for p in cut if p.kind == kind).strip()
        for kind in ("reasoning", "answer")
    )
    return thoughts, answer


def answer_of(text: str) -> str:
    """What a reply says to its reader, as Copy takes it: its answer, its markup and
    thoughts left out; a reply cut off before it answered gives its thoughts."""
    if not has_reasoning(text):
        return text
    thoughts, answer = split(text)
    return answer or thoughts
