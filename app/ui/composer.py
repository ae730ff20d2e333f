"""The composer: message field with Send and Stop."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.ui.shortcuts import shortcut_text

STOP_TEXT = "Stop"
STOPPING_TEXT = "Stopping…"


class Composer(QWidget):
    """Where the user writes; Cmd/Ctrl+Return sends, Esc stops."""

    send_requested = Signal(str)
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.editor = QPlainTextEdit()
        self.editor.setPlaceholderText(f"Message Tandem…  ({shortcut_text('Ctrl+Return')} to send)")
        self.editor.setAccessibleName("Message")
        self.editor.setTabChangesFocus(True)
        self.editor.setMaximumHeight(120)
        self.send_button = QPushButton("Send")
        self.send_button.setAccessibleName("Send message")
        self.send_button.setDefault(True)
        self.stop_button = QPushButton(STOPPING_TEXT)
        # Wide enough for "Stopping…", so the buttons keep their size when it shows.
        self.stop_button.setMinimumWidth(self.stop_button.sizeHint().width())
        self.stop_button.setText(STOP_TEXT)
        self.stop_button.setAccessibleName("Stop reply")
        self.stop_button.setEnabled(False)
        self.send_button.clicked.connect(self._on_send_clicked)
        self.stop_button.clicked.connect(self.stop_requested)
        # Qt maps Ctrl to Cmd on macOS.
        for seq in ("Ctrl+Return", "Ctrl+Enter"):
            send = QShortcut(QKeySequence(seq), self)
            send.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            send.activated.connect(self._on_send_clicked)
        stop = QShortcut(QKeySequence(Qt.Key.Key_Escape), self)
        stop.setContext(Qt.ShortcutContext.WindowShortcut)
        stop.activated.connect(self.stop_requested)

        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.editor, 1)
        layout.addLayout(buttons)

    @Slot()
    def _on_send_clicked(self) -> None:
        text = self.editor.toPlainText().strip()
        if text and self.send_button.isEnabled():
            self.send_requested.emit(text)

    def set_busy(self, busy: bool) -> None:
        """Send while idle, Stop while a reply runs; either way Stop reads "Stop" again."""
        self.send_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)
        self.stop_button.setText(STOP_TEXT)

    def show_stopping(self) -> None:
        """Says Stop was heard: the button reads "Stopping…" until :meth:`set_busy` ends it."""
        self.stop_button.setEnabled(False)
        self.stop_button.setText(STOPPING_TEXT)

    def focus(self) -> None:
        """Puts the cursor in the message field."""
        self.editor.setFocus()

    def clear(self) -> None:
        self.editor.clear()
