"""Sizes that keep a widget's text whole."""

from __future__ import annotations

from PySide6.QtWidgets import QLineEdit

# QLineEdit's sizeHint is 17 "x" wide plus its margins and frame.
_HINT_CHARS = 17


def line_edit_chrome(edit: QLineEdit) -> int:
    """Pixels of ``edit``'s width that its frame and margins take from its text."""
    return edit.sizeHint().width() - _HINT_CHARS * edit.fontMetrics().horizontalAdvance("x")


def text_room(edit: QLineEdit) -> int:
    """Pixels ``edit`` has for its text at its present width."""
    return edit.width() - line_edit_chrome(edit)


def fit_placeholder(edit: QLineEdit) -> None:
    """Never narrower than its whole placeholder."""
    advance = edit.fontMetrics().horizontalAdvance(edit.placeholderText())
    edit.setMinimumWidth(advance + line_edit_chrome(edit) + 1)
