"""Editing keys belong to the text field that has focus, not to a menu shortcut.

File ▸ Delete Chat… is Ctrl+Backspace (⌘⌫ on a Mac), which is also how a text
field deletes a word (or, on a Mac, to the start of the line). Qt asks the
focused widget first with a ShortcutOverride event; text fields do not claim
every editing key there, so without this the shortcut fired while the user was
typing.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QAbstractSpinBox, QLineEdit, QPlainTextEdit, QTextEdit

_EDITING_KEYS = (Qt.Key.Key_Backspace, Qt.Key.Key_Delete)


def _editable(widget: QObject) -> bool:
    try:
        if isinstance(widget, QLineEdit | QAbstractSpinBox | QPlainTextEdit | QTextEdit):
            return not widget.isReadOnly()
    except RuntimeError:  # a widget whose C++ side is already gone
        return False
    return False


class EditingKeysFirst(QObject):
    """An application event filter for editing keys.

    Backspace and Delete, with any modifier, go to an editable text field that
    has focus instead of firing a shortcut.
    """

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if (
            event.type() == QEvent.Type.ShortcutOverride
            and isinstance(event, QKeyEvent)
            and event.key() in _EDITING_KEYS
            and _editable(watched)
        ):
            event.accept()  # the field takes the key as a key press
            return True
        return False
