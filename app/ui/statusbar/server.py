"""The status bar's server segment: where the local server listens and how busy it is."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget

from app.ui.server_panel import ClickableLabel


class ServerSegment(ClickableLabel):
    """ "Serving http://… · 2 requests"; hidden while the server is off. Click: its panel."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Local server")
        self.hide()

    def show_server(self, url: str, requests: int) -> None:
        """Shows the server at ``url`` (``""``: it is off) and the requests it served."""
        self.setText(f"Serving {url} · {requests} request{'s' if requests != 1 else ''}")
        self.setToolTip("Tandem's OpenAI-compatible server; click for its key and log")
        self.setVisible(bool(url))
