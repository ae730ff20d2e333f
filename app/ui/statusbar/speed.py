"""The status bar's speed segment: the reply's tok/s and speedup, live and then final."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QWidget

from app.engine.live import LiveSnapshot
from app.engine.types import Stats

MEASURING = "… tok/s"  # a reply that has not timed a round yet


def speed_text(tps: float | None, speedup: float | None) -> str:
    """ "12.3 tok/s (1.80× plain)"; no speedup when ``None``; :data:`MEASURING` without a speed."""
    if tps is None:
        return MEASURING
    text = f"{tps:.1f} tok/s"
    if speedup is not None:
        text += f" ({speedup:.2f}× plain)"
    return text


def format_speed(stats: Stats) -> str:
    """A reply's final speed; the speedup only when the reply drafted."""
    return speed_text(stats.generation_tps, stats.speedup if stats.drafted else None)


def format_live_speed(snapshot: LiveSnapshot) -> str:
    """The speed of the reply in flight, with the same rule for the speedup."""
    return speed_text(snapshot.tps, snapshot.speedup if snapshot.drafted else None)


class SpeedSegment(QLabel):
    """The reply's speed: live while it streams, final once it ended."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("", parent)

    def show_stats(self, stats: Stats) -> None:
        self.setText(format_speed(stats))

    def show_live(self, snapshot: LiveSnapshot) -> None:
        self.setText(format_live_speed(snapshot))
