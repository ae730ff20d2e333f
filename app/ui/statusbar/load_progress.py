"""The status bar's loading progress segment, shown only while a pair loads."""

from __future__ import annotations

from PySide6.QtWidgets import QProgressBar, QWidget


class LoadProgressSegment(QProgressBar):
    """A progress bar for the steps of loading a pair."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Loading progress")
        self.setMaximumWidth(160)
        self.hide()

    def start(self) -> None:
        """Shows a busy bar until the first step is known."""
        self.setRange(0, 0)
        self.show()

    def show_step(self, step: int, steps: int) -> None:
        self.setRange(0, steps)
        self.setValue(step)

    def finish(self) -> None:
        self.hide()
