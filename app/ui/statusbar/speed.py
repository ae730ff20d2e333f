"""The status bar's speed segment: the last reply's tok/s and speedup."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QWidget

from app.engine.types import Stats


def format_speed(stats: Stats) -> str:
    """ "12.3 tok/s (1.80× plain)"; the speedup only when the reply drafted."""
    tps = f"{stats.generation_tps:.1f} tok/s"
    if stats.speedup is not None and stats.drafted:
        tps += f" ({stats.speedup:.2f}× plain)"
    return tps


class SpeedSegment(QLabel):
    """The last reply's speed."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("", parent)

    def show_stats(self, stats: Stats) -> None:
        self.setText(format_speed(stats))
