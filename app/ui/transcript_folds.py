"""Folding a reply's reasoning: its label's link hides the lines under it and shows them again.

The Markdown renderer marks the label's block and the first block of the answer
after it (:data:`app.ui.markdown.LABEL_STATE`, :data:`~app.ui.markdown.ANSWER_STATE`);
the reasoning is every block between the label and the answer, the next label, or
the message's end. Folded blocks take :data:`FOLDED_STATE`, so that copies of a
selection can leave them out too. Only the label's mark changes (one character for
another): the document's positions, which the transcript keeps for its messages,
stay as they are.
"""

from __future__ import annotations

from PySide6.QtGui import QTextBlock, QTextCursor, QTextDocument

from app.ui.markdown import ANSWER_STATE, FOLDED_MARK, LABEL_STATE, OPEN_MARK
from app.ui.transcript_style import FOOTER_PROPERTY, HEADER_PROPERTY

FOLDED_STATE = 3
_NO_STATE = -1


def is_label(block: QTextBlock) -> bool:
    """Whether ``block`` is the line that heads a reply's reasoning and folds it (a streaming
    reply's label does not)."""
    return block.userState() == LABEL_STATE and block.text()[:1] in (OPEN_MARK, FOLDED_MARK)


def is_folded(label: QTextBlock) -> bool:
    """Whether the reasoning under ``label`` is folded away."""
    return label.text().startswith(FOLDED_MARK)


def is_folded_away(block: QTextBlock) -> bool:
    """Whether ``block`` is reasoning folded away."""
    return block.userState() == FOLDED_STATE


def set_folded(label: QTextBlock, folded: bool) -> None:
    """Folds the reasoning under ``label`` away, or shows it again."""
    region = _region(label)
    for block in region:
        block.setVisible(not folded)
        block.setUserState(FOLDED_STATE if folded else _NO_STATE)
    _mark(label, FOLDED_MARK if folded else OPEN_MARK)
    end = region[-1] if region else label
    doc = label.document()
    doc.markContentsDirty(label.position(), end.position() + end.length() - label.position())


def fold_all(doc: QTextDocument, start: int = 0) -> None:
    """Folds away the reasoning of every reply from position ``start`` on."""
    block = doc.findBlock(start)
    while block.isValid():
        if is_label(block) and not is_folded(block):
            set_folded(block, True)
        block = block.next()


def _region(label: QTextBlock) -> list[QTextBlock]:
    """The blocks of reasoning under ``label``."""
    blocks = []
    block = label.next()
    while block.isValid() and block.userState() not in (LABEL_STATE, ANSWER_STATE):
        fmt = block.blockFormat()
        if fmt.boolProperty(FOOTER_PROPERTY) or fmt.boolProperty(HEADER_PROPERTY):
            break
        blocks.append(block)
        block = block.next()
    return blocks


def _mark(label: QTextBlock, mark: str) -> None:
    """Puts ``mark`` in place of the label's first character, in its format."""
    cursor = QTextCursor(label)
    cursor.movePosition(QTextCursor.MoveOperation.NextCharacter, QTextCursor.MoveMode.KeepAnchor)
    fmt = cursor.charFormat()
    cursor.insertText(mark, fmt)
