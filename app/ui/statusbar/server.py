"""The status bar's server segment: where the local server listens and how busy it is."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget

from app.ui.server_panel import ClickableLabel


class ServerSegment(ClickableLabel):
    """ "Serving http://… · 12 requests · 3 in progress"; hidden while off. Click: its panel."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Local server")
        self.hide()

    def show_server(self, url: str, requests: int, in_progress: int = 0) -> None:
        """Shows the server at ``url`` (``""``: off), requests served and requests in progress."""
        text = f"Serving {url} · {requests} request{'s' if requests != 1 else ''}"
        if in_progress:
            text += f" · {in_progress} in progress"
        self.setText(text)
        self.setToolTip("Tandem's OpenAI-compatible server; click for its key and log")
        self.setVisible(bool(url))
