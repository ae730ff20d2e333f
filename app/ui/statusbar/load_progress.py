"""The status bar's loading progress segment, shown only while a pair loads."""

from __future__ import annotations

from PySide6.QtWidgets import QProgressBar, QWidget

from app.hub.library import human_size
from app.services import LoadProgress

_SCALE = 1000  # bar steps: a model's bytes move it smoothly


def load_text(p: LoadProgress) -> str:
    """What loading says now, e.g. "Loading qwen-7b: 2.1 of 6.2 GB, about 20 s left"."""
    if p.total <= 0:
        return p.text
    done, total = human_size(p.done), human_size(p.total)
    number, unit = done.split(" ")
    if total.endswith(f" {unit}"):  # "2.1 of 6.2 GB": the unit once
        done = number
    text = f"{p.text}: {done} of {total}"
    left = p.seconds_left
    if left is not None:
        when = f"{max(round(left), 1)} s" if left < 90 else f"{round(left / 60)} min"
        text += f", about {when} left"
    return text


class LoadProgressSegment(QProgressBar):
    """A progress bar for loading a pair, moved by the steps and the bytes read."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Loading progress")
        self.setMaximumWidth(160)
        self.hide()

    def start(self) -> None:
        """Shows a busy bar until the first step is known."""
        self.setRange(0, 0)
        self.show()

    def show_progress(self, p: LoadProgress) -> None:
        """Moves the bar to the share of the load ``p`` says is done."""
        self.setRange(0, _SCALE)
        self.setValue(round(p.fraction * _SCALE))

    def finish(self) -> None:
        self.hide()
