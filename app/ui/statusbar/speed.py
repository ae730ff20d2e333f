"""The status bar's speed segment: the reply's tok/s and speedup, live and then final."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget

from app.engine.live import LiveSnapshot
from app.engine.types import Stats, speedup_missing
from app.ui.statusbar.elided import ElidedLabel

MEASURING = "… tok/s"  # a reply that has not timed a round yet


def speed_text(tps: float | None, speedup: float | None, missing: str = "") -> str:
    """ "12.3 tok/s (1.80× plain)"; ``missing`` says why there is no speedup, if it should.

    :data:`MEASURING` without a speed.
    """
    if tps is None:
        return MEASURING
    text = f"{tps:.1f} tok/s"
    if speedup is not None:
        text += f" ({speedup:.2f}× plain)"
    elif missing:
        text += f" (speedup: {missing})"
    return text


def format_speed(stats: Stats) -> str:
    """A reply's final speed; the speedup (or why there is none) only when the reply drafted."""
    if not stats.drafted:
        return speed_text(stats.generation_tps, None)
    missing = speedup_missing(stats.baseline_tps, stats.tokens)
    return speed_text(stats.generation_tps, stats.speedup, missing)


def format_live_speed(snapshot: LiveSnapshot) -> str:
    """The speed of the reply in flight, with the same rule for the speedup."""
    if not snapshot.drafted:
        return speed_text(snapshot.tps, None)
    missing = speedup_missing(snapshot.baseline_tps, snapshot.tokens)
    return speed_text(snapshot.tps, snapshot.speedup, missing)


class SpeedSegment(ElidedLabel):
    """The reply's speed: live while it streams, final once it ended."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("", parent)

    def show_stats(self, stats: Stats) -> None:
        self.setText(format_speed(stats))

    def show_live(self, snapshot: LiveSnapshot) -> None:
        self.setText(format_live_speed(snapshot))
