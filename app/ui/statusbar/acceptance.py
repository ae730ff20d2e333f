"""The status bar's acceptance segment: how many drafted tokens the last reply kept."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QWidget

from app.engine.types import Stats


def format_acceptance(stats: Stats) -> str:
    """ "75% accepted (3/4), k 2–4", or "no drafting"."""
    acc = stats.acceptance
    if acc is None:
        return "no drafting"
    k = f"k {stats.k_min}–{stats.k_max}" if stats.k_min != stats.k_max else f"k {stats.k_max}"
    return f"{acc:.0%} accepted ({stats.accepted}/{stats.drafted}), {k}"


class AcceptanceSegment(QLabel):
    """The last reply's acceptance and draft lengths."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("", parent)

    def show_stats(self, stats: Stats) -> None:
        self.setText(format_acceptance(stats))
