"""The status bar's acceptance segment: how many drafted tokens the reply kept."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget

from app.engine.live import LiveSnapshot
from app.engine.types import Stats
from app.ui.statusbar.elided import ElidedLabel


def acceptance_text(share: float | None, accepted: int, drafted: int, k: str) -> str:
    """ "75% accepted (3/4), k 2–4", or "no drafting" when ``share`` is ``None``."""
    if share is None:
        return "no drafting"
    return f"{share:.0%} accepted ({accepted}/{drafted}), {k}"


def format_acceptance(stats: Stats) -> str:
    """A reply's final acceptance and the span of its draft lengths."""
    k = f"k {stats.k_min}–{stats.k_max}" if stats.k_min != stats.k_max else f"k {stats.k_max}"
    return acceptance_text(stats.acceptance, stats.accepted, stats.drafted, k)


def format_live_acceptance(snapshot: LiveSnapshot) -> str:
    """The acceptance of the reply in flight and the k of its last round."""
    s = snapshot
    k = "k —" if s.k is None else f"k {s.k}"
    return acceptance_text(s.message_acceptance, s.accepted, s.drafted, k)


class AcceptanceSegment(ElidedLabel):
    """The reply's acceptance and draft lengths: live while it streams, final once it ended."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("", parent)

    def show_stats(self, stats: Stats) -> None:
        self.setText(format_acceptance(stats))

    def show_live(self, snapshot: LiveSnapshot) -> None:
        self.setText(format_live_acceptance(snapshot))
