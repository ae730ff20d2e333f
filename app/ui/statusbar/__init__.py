"""The main window's status bar, one segment per module (as in qutebrowser)."""

from __future__ import annotations

from PySide6.QtWidgets import QStatusBar, QWidget

from app.engine.live import LiveSnapshot
from app.engine.types import Stats
from app.ui.statusbar.acceptance import AcceptanceSegment, format_acceptance
from app.ui.statusbar.context import CONTEXT_WARNING, ContextSegment
from app.ui.statusbar.load_progress import LoadProgressSegment
from app.ui.statusbar.pair import NO_PAIR, PairSegment
from app.ui.statusbar.server import ServerSegment
from app.ui.statusbar.speed import SpeedSegment, format_speed


def format_stats(stats: Stats) -> tuple[str, str]:
    """Status bar texts for tok/s and acceptance."""
    return format_speed(stats), format_acceptance(stats)


class StatusBar(QStatusBar):
    """The pair on the left; loading, context, speed, acceptance and server on the right."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.pair = PairSegment()
        self.load_progress = LoadProgressSegment()
        self.context = ContextSegment()
        self.speed = SpeedSegment()
        self.acceptance = AcceptanceSegment()
        self.server = ServerSegment()
        self.addWidget(self.pair, 1)
        for segment in (self.load_progress, self.context, self.speed, self.acceptance):
            self.addPermanentWidget(segment)
        self.addPermanentWidget(self.server)

    def show_reply_stats(self, stats: Stats) -> None:
        """Shows the ended reply's final speed and acceptance."""
        self.speed.show_stats(stats)
        self.acceptance.show_stats(stats)

    def show_context(self, used: int | None, window: int | None) -> None:
        """Shows how much of the target's window the chat fills.

        Args:
            used: Tokens the chat fills; ``None`` while a reply's prompt is not counted.
            window: The target's window in tokens; ``None`` hides the figures.
        """
        self.context.show_usage(used, window)

    def show_live(self, snapshot: LiveSnapshot) -> None:
        """Shows the speed and acceptance of the reply in flight, never the last one's."""
        self.speed.show_live(snapshot)
        self.acceptance.show_live(snapshot)


__all__ = [
    "CONTEXT_WARNING",
    "NO_PAIR",
    "AcceptanceSegment",
    "ContextSegment",
    "LoadProgressSegment",
    "PairSegment",
    "ServerSegment",
    "SpeedSegment",
    "StatusBar",
    "format_stats",
]
