"""The status bar's context segment: how much of the target's window the chat fills."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget

from app.ui.statusbar.elided import ElidedLabel

CONTEXT_WARNING = 0.85  # share of the window past which the segment warns


class ContextSegment(ElidedLabel):
    """ "Context 120 / 1,000", amber past :data:`CONTEXT_WARNING`."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("", parent)
        self.setAccessibleName("Context used")

    def show_usage(self, used: int | None, window: int | None) -> None:
        """Shows ``used`` tokens of a ``window``-token context.

        Args:
            used: Tokens the conversation fills; ``None`` while a reply's prompt
                is not counted yet ("Context … / 32,768").
            window: The target's window; ``None`` hides the figures.
        """
        if window is None:
            self.setText("")
            return
        if used is None:
            self.setText(f"Context … / {window:,}")
            self.setStyleSheet("")
            self.setToolTip("Counting the tokens of the reply's prompt…")
            return
        share = used / window
        self.setText(f"Context {used:,} / {window:,}")
        warn = share >= CONTEXT_WARNING
        self.setStyleSheet("color: #d97706;" if warn else "")
        self.setToolTip(
            f"The conversation uses {share:.0%} of the model's window; start a new chat "
            "before it fills up."
            if warn
            else f"The conversation uses {share:.0%} of the model's {window:,}-token window."
        )
