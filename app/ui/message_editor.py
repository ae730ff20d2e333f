"""Editing a user message in place, in the transcript.

The editor wraps its text (never scrolls sideways) and grows with it up to a
limit; Ctrl+Return (⌘↩ on a Mac) saves and Esc cancels.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal, Slot
from PySide6.QtGui import QKeyEvent, QPalette
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.ui.shortcuts import shortcut_text

SAVE_TEXT = "Save && Regenerate"
MIN_LINES = 2
MAX_LINES = 12


def _is_save(event: QKeyEvent) -> bool:
    # Qt reports ⌘ as Control on macOS.
    return event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and bool(
        event.modifiers() & Qt.KeyboardModifier.ControlModifier
    )


class _TextField(QPlainTextEdit):
    """The editor's text: claims Esc and Ctrl+Return before any window shortcut."""

    save_pressed = Signal()
    escape_pressed = Signal()

    def event(self, event: QEvent) -> bool:
        # The composer's Esc (stop the reply) is a window shortcut; here Esc cancels.
        if (
            event.type() == QEvent.Type.ShortcutOverride
            and isinstance(event, QKeyEvent)
            and (event.key() == Qt.Key.Key_Escape or _is_save(event))
        ):
            event.accept()
            return True
        return super().event(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() == Qt.Key.Key_Escape:
            self.escape_pressed.emit()
        elif _is_save(event):
            self.save_pressed.emit()
        else:
            super().keyPressEvent(event)


class MessageEditor(QFrame):
    """A wrapping text field with Save & Regenerate and Cancel.

    ``submitted`` carries the text as typed; the caller decides whether it changed.
    ``height_changed`` asks the host to lay the editor out again as its text grows.
    """

    submitted = Signal(str)
    cancelled = Signal()
    height_changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageEditor")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        # A card that hides the message it lies over and stands out from the transcript.
        self.setBackgroundRole(QPalette.ColorRole.AlternateBase)
        self.setAutoFillBackground(True)
        self.field = _TextField()
        self.field.setAccessibleName("Edit message")
        self.field.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.field.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.field.setTabChangesFocus(True)
        self.field.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.save_button = QPushButton(SAVE_TEXT)
        self.save_button.setToolTip(f"Resend on a new branch ({shortcut_text('Ctrl+Return')})")
        self.save_button.setDefault(True)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Keep the message as it is (Esc)")
        self.save_button.clicked.connect(self._on_save_pressed)
        self.cancel_button.clicked.connect(self.cancelled)
        self.field.save_pressed.connect(self._on_save_pressed)
        self.field.escape_pressed.connect(self.cancelled)
        self.field.document().documentLayout().documentSizeChanged.connect(
            self._on_document_size_changed
        )

        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.save_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.setSpacing(6)
        layout.addWidget(self.field)
        layout.addLayout(buttons)

    def start(self, text: str) -> None:
        """Fills the field with ``text``, the cursor at its end, and takes the focus."""
        self.field.setPlainText(text)
        self.field.moveCursor(self.field.textCursor().MoveOperation.End)
        self._fit()
        self.field.setFocus()

    def text(self) -> str:
        return self.field.toPlainText()

    def wanted_height(self) -> int:
        """The height that shows the field's lines (within limits) and the buttons."""
        self._fit()
        return self.sizeHint().height()

    def _fit(self) -> None:
        """Sizes the field to its wrapped lines, between MIN_LINES and MAX_LINES."""
        # A plain-text document's height counts its wrapped lines.
        lines = int(self.field.document().size().height())
        lines = min(max(lines, MIN_LINES), MAX_LINES)
        frame = self.field.frameWidth() * 2
        margin = int(self.field.document().documentMargin() * 2)
        spacing = self.field.fontMetrics().lineSpacing()
        self.field.setFixedHeight(lines * spacing + frame + margin + 2)

    @Slot()
    def _on_save_pressed(self) -> None:
        self.submitted.emit(self.text())

    @Slot()
    def _on_document_size_changed(self) -> None:
        before = self.field.height()
        self._fit()
        if self.field.height() != before:
            self.height_changed.emit()
