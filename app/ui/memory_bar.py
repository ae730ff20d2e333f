"""A bar of the memory a pair needs against the memory this machine can give it."""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import QSizePolicy, QWidget

from app.hub import human_size
from app.hub.fit import MemoryFit

WEIGHTS = QColor("#3b82f6")
KV = QColor("#a855f7")
MARGIN = QColor("#94a3b8")
OVER = QColor("#dc2626")


class MemoryBar(QWidget):
    """Weights, KV caches and margin, drawn to scale within the usable memory.

    Past the usable memory the bar turns red and overflows to the right edge.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.fit: MemoryFit | None = None
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setAccessibleName("Memory needed")

    def sizeHint(self) -> QSize:
        return QSize(360, 22)

    def set_fit(self, fit: MemoryFit | None) -> None:
        self.fit = fit
        self.setVisible(fit is not None)
        if fit is not None:
            text = self.summary()
            self.setToolTip(fit.detail)
            self.setAccessibleDescription(text)
        self.update()

    def summary(self) -> str:
        """One line for the tooltip and for screen readers."""
        f = self.fit
        if f is None:
            return ""
        verdict = "fits" if f.fits else "does not fit"
        text = (
            f"Needs {human_size(f.needed_bytes)} of {human_size(f.available_bytes)} usable "
            f"({verdict}): weights {human_size(f.weights_bytes)}, "
            f"KV caches {human_size(f.kv_bytes)}"
        )
        if f.reused_bytes:  # in memory now and kept, so not needed again
            text += f"; {human_size(f.reused_bytes)} of it loaded already"
        return text

    def segments(self) -> list[tuple[float, QColor]]:
        """Fractions of the bar's width for weights, KV caches and margin."""
        f = self.fit
        if f is None:
            return []
        scale = max(f.available_bytes, f.needed_bytes, 1)
        margin = max(f.needed_bytes - f.weights_bytes - f.kv_bytes, 0)
        parts = ((f.weights_bytes, WEIGHTS), (f.kv_bytes, KV), (margin, MARGIN))
        return [(n / scale, OVER if not f.fits else color) for n, color in parts]

    def paintEvent(self, event: QPaintEvent) -> None:
        if self.fit is None:
            return
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        p.setPen(self.palette().color(QPalette.ColorRole.Mid))
        p.setBrush(self.palette().color(QPalette.ColorRole.Base))
        p.drawRoundedRect(rect, 4, 4)
        x = rect.left()
        p.setPen(Qt.PenStyle.NoPen)
        for fraction, color in self.segments():
            w = fraction * rect.width()
            p.setBrush(color)
            p.drawRect(QRectF(x, rect.top() + 1, w, rect.height() - 2))
            x += w
        p.setPen(self.palette().color(QPalette.ColorRole.Text))
        text = (
            f"{human_size(self.fit.needed_bytes)} of {human_size(self.fit.available_bytes)} usable"
        )
        p.drawText(rect.adjusted(6, 0, -6, 0), Qt.AlignmentFlag.AlignVCenter, text)
        p.end()
