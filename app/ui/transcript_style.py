"""How the transcript looks: origin colours, link schemes and text formats."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtGui import (
    QColor,
    QFont,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextFormat,
)

from app.engine.types import Origin, Reading, Segment, Stats
from app.store import StoredMessage
from app.ui.markdown import COPY_SCHEME, LABEL_STATE

ROLE_LABELS = {"user": "You", "assistant": "Tandem", "system": "System"}

# Translucent backgrounds keep the text's own colour, so they read in light and dark mode.
ORIGIN_COLORS: dict[Origin, QColor] = {
    Origin.DRAFT: QColor(34, 197, 94, 70),
    Origin.MTP: QColor(20, 184, 166, 70),
    Origin.LOOKUP: QColor(14, 165, 233, 70),
    Origin.CORRECTION: QColor(249, 115, 22, 90),
    Origin.BONUS: QColor(168, 85, 247, 70),
}
ORIGIN_LABELS: dict[Origin, str] = {
    Origin.DRAFT: "accepted draft",
    Origin.MTP: "accepted MTP draft",
    Origin.LOOKUP: "prompt lookup",
    Origin.CORRECTION: "target correction",
    Origin.BONUS: "bonus token",
}
STATS_SCHEME = "stats"
COPY_MESSAGE_SCHEME = "copy-message"
EDIT_SCHEME = "edit"
REGENERATE_SCHEME = "regenerate"
DELETE_SCHEME = "delete"
PREVIOUS_BRANCH_SCHEME = "branch-previous"
NEXT_BRANCH_SCHEME = "branch-next"

# A branch arrow, spaced inside its link so that the whole ~20 px square is the target.
ARROW_TEXT = "\u2002{}\u2002"
ARROW_SCALE = 1.6  # of the body font: the arrow's line is about 20 px high

# Each footer link's scheme and the signal it emits with the message id.
ACTION_SIGNALS = {
    STATS_SCHEME: "stats_requested",
    COPY_MESSAGE_SCHEME: "copy_requested",
    EDIT_SCHEME: "edit_requested",
    REGENERATE_SCHEME: "regenerate_requested",
    DELETE_SCHEME: "delete_requested",
}
BRANCH_DELTAS = {PREVIOUS_BRANCH_SCHEME: -1, NEXT_BRANCH_SCHEME: +1}


def origin_format(origin: Origin | None, colour: bool) -> QTextCharFormat:
    """The character format of a token of ``origin``."""
    fmt = QTextCharFormat()
    if colour and origin in ORIGIN_COLORS:
        assert origin is not None
        fmt.setBackground(ORIGIN_COLORS[origin])
        fmt.setToolTip(ORIGIN_LABELS[origin])
    return fmt


TOOLTIPS = {
    "Edit": "Edit this message and send it again",
    "Copy": "Copy this message",
    "Regenerate": "Write this reply again",
    "Delete": "Delete this message",
    "Stats…": "Show this reply's statistics",
}


# Marks a message's footer block (its links), which copied text leaves out.
FOOTER_PROPERTY = QTextFormat.Property.UserProperty.value + 1
# Marks a message's first block, its role's label.
HEADER_PROPERTY = QTextFormat.Property.UserProperty.value + 2


def header_format() -> QTextBlockFormat:
    fmt = QTextBlockFormat()
    fmt.setTopMargin(10)
    fmt.setProperty(HEADER_PROPERTY, True)
    return fmt


def bold() -> QTextCharFormat:
    fmt = QTextCharFormat()
    fmt.setFontWeight(QFont.Weight.Bold)
    return fmt


def is_chrome(block: QTextBlock) -> bool:
    """Whether ``block`` is links about the text, not text: a footer, a code block's header
    or the label that folds a reply's reasoning."""
    return (
        block.blockFormat().boolProperty(FOOTER_PROPERTY)
        or is_code_header(block)
        or block.userState() == LABEL_STATE
    )


def is_code_header(block: QTextBlock) -> bool:
    """Whether ``block`` is the line with a code block's Copy link."""
    it = block.begin()
    return not it.atEnd() and it.fragment().charFormat().anchorHref().startswith(COPY_SCHEME + ":")


def split_segments(segments: Sequence[Segment], length: int) -> tuple[list[Segment], list[Segment]]:
    """The runs of the first ``length`` characters and of the rest."""
    head: list[Segment] = []
    tail: list[Segment] = []
    left = length
    for origin, text in segments:
        if left >= len(text):
            head.append((origin, text))
            left -= len(text)
        elif left > 0:
            head.append((origin, text[:left]))
            tail.append((origin, text[left:]))
            left = 0
        else:
            tail.append((origin, text))
    return head, tail


def finish_note(reason: str | None, stats: Stats | None) -> str:
    """The muted line under a reply that did not end by itself ("" for one that did).

    Args:
        reason: Why it ended (a :data:`FinishReason`).
        stats: Its numbers: a reply cut at the limit has generated exactly that many tokens.
    """
    if reason == "length":
        limit = f"{stats.tokens:,}-token" if stats is not None and stats.tokens else "token"
        return f"Stopped at the {limit} limit."
    return {"cancelled": "Stopped.", "error": "Interrupted by an error."}.get(reason or "", "")


def note_of(m: StoredMessage) -> str:
    return finish_note(m.finish_reason, m.stats) if m.role == "assistant" else ""


def reading_note(reading: Reading) -> str:
    """What an empty reply says while the prompt is read: "Reading 1,204 tokens… 40 %"."""
    text = f"Reading {reading.total:,} tokens… {int(reading.fraction * 100)} %"
    return f"{text} · {reading.reused:,} reused" if reading.reused else text


def waiting_note(running: int) -> str:
    """What an empty reply says while it waits for a place beside the local server's replies."""
    replies = "reply" if running == 1 else "replies"
    return f"Waiting for a place: the local server is running {running} {replies}…"


def branch_arrow_format(base: QTextCharFormat, body_points: float) -> QTextCharFormat:
    """``base`` enlarged and bold for a branch arrow, large enough to hit."""
    arrow = QTextCharFormat(base)
    if body_points > 0:
        arrow.setFontPointSize(body_points * ARROW_SCALE)
    arrow.setFontWeight(QFont.Weight.Bold)
    return arrow
