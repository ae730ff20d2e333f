"""The status bar's pair segment: which pair is loaded, or what loading does now."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget

from app.services import PairInfo
from app.ui.statusbar.elided import ElidedLabel

NO_PAIR = "No model loaded"


class PairSegment(ElidedLabel):
    """The loaded pair's name, "No model loaded", or the loading step."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(NO_PAIR, parent, keep=24)  # the pair matters most: it shrinks last

    def show_pair(self, pair: PairInfo | None) -> None:
        """Names the loaded pair; ``None``: none is loaded."""
        self.setText(pair.label if pair is not None else NO_PAIR)

    def show_loading(self, what: str) -> None:
        """Says what loading does now ("Loading tiny-llama…")."""
        self.setText(f"{what}…")
