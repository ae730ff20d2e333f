"""The status bar's server segment: where the local server listens and how busy it is."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QCursor, QMouseEvent
from PySide6.QtWidgets import QWidget

from app.ui.statusbar.elided import ElidedLabel


class ServerSegment(ElidedLabel):
    """ "Serving http://… · 12 requests · 3 in progress"; hidden while off. Click: its panel.

    Signals:
        clicked: The segment was clicked.
    """

    clicked = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("", parent)
        self.setAccessibleName("Local server")
        self.setCursor(QCursor(Qt.CursorShape.PointingHandCursor))
        self.hide()

    def show_server(self, url: str, requests: int, in_progress: int = 0) -> None:
        """Shows the server at ``url`` (``""``: off), requests served and requests in progress."""
        text = f"Serving {url} · {requests} request{'s' if requests != 1 else ''}"
        if in_progress:
            text += f" · {in_progress} in progress"
        self.setText(text)
        self.setToolTip("Tandem's OpenAI-compatible server; click for its key and log")
        self.setVisible(bool(url))

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        if event.button() == Qt.MouseButton.LeftButton:
            self.clicked.emit()
        super().mouseReleaseEvent(event)
