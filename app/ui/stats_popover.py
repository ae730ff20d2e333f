"""A popover with one reply's statistics."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QFormLayout, QFrame, QLabel, QWidget

from app.engine.types import Stats, speedup_missing


def _name(path: str | None) -> str:
    return Path(path).name if path else "none"


def stats_rows(stats: Stats, target: str | None, draft: str | None) -> list[tuple[str, str]]:
    """Label and value of each statistic, in the order the popover shows them."""
    rows = [
        ("Tokens", f"{stats.tokens:,}"),
        ("Speed", f"{stats.generation_tps:.1f} tok/s"),
    ]
    acceptance = stats.acceptance
    scope = getattr(stats, "stats_scope", None)
    if scope == "not reported":  # a remote server that does not say: never guess
        rows.append(("Acceptance", "not reported by the server"))
    elif acceptance is None:
        rows.append(("Acceptance", "no drafting"))
    else:
        wide = " across the server" if scope == "server" else ""
        rows.append(
            ("Acceptance", f"{acceptance:.0%} ({stats.accepted:,} of {stats.drafted:,}){wide}")
        )
        if stats.lookup_accepted:
            rows.append(("From prompt lookup", f"{stats.lookup_accepted:,} tokens"))
    if stats.mean_accepted is not None:
        rows.append(("Mean accepted length", f"{stats.mean_accepted:.2f}"))
    if stats.tokens_per_call is not None:
        rows.append(("Tokens per target call", f"{stats.tokens_per_call:.2f}"))
    if stats.draft_rounds:
        span = f"{stats.k_min}" if stats.k_min == stats.k_max else f"{stats.k_min}–{stats.k_max}"
        rows.append(("Draft length k", f"auto, {span}" if stats.num_draft is None else span))
    speedup = stats.speedup
    missing = speedup_missing(stats.baseline_tps, stats.tokens)
    rows.append(("Speed-up", f"{speedup:.2f}× plain" if speedup is not None else missing))
    rows.append(("Time to first token", f"{stats.ttft_seconds:.2f} s"))
    reused = f", {stats.reused_tokens:,} reused" if stats.reused_tokens else ""
    rows.append(("Prompt", f"{stats.prompt_tokens:,} tokens{reused}"))
    rows.append(("Pair", f"{_name(target)} + {_name(draft)}" if draft else _name(target)))
    return rows


class StatsPopover(QFrame):
    """Closes itself when the user clicks elsewhere, like a macOS popover."""

    def __init__(
        self, stats: Stats, target: str | None, draft: str | None, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent, Qt.WindowType.Popup)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAccessibleName("Reply statistics")
        form = QFormLayout(self)
        self.rows = stats_rows(stats, target, draft)
        for label, value in self.rows:
            text = QLabel(value)
            text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            form.addRow(f"{label}:", text)

    def show_at(self, pos: QPoint) -> None:
        self.adjustSize()
        self.move(pos)
        self.show()
