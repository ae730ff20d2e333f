"""A status-bar label that shrinks with the window: it elides its text instead of widening it."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtGui import QHelpEvent, QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import QLabel, QSizePolicy, QToolTip, QWidget


class ElidedLabel(QLabel):
    """A plain-text label that asks for its whole text but makes do with its first letters.

    ``text()`` stays whole; only the painted text is elided, and the tooltip then
    shows it whole above the label's own tooltip.

    Args:
        text: The text.
        parent: The parent widget.
        keep: Letters shown however narrow the window: a segment that matters more
            keeps more of its text, the others shrink first.
    """

    def __init__(self, text: str = "", parent: QWidget | None = None, keep: int = 2) -> None:
        super().__init__(text, parent)
        self._keep = keep
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)

    def minimumSizeHint(self) -> QSize:
        # QLabel's minimum is its whole text, which would hold the window open.
        hint = super().minimumSizeHint()
        if not self.text():
            return QSize(0, hint.height())
        margins = hint.width() - self.fontMetrics().horizontalAdvance(self.text())
        shown = self.text()[: self._keep] + "…"
        narrow = self.fontMetrics().horizontalAdvance(shown) + max(margins, 0)
        return QSize(min(hint.width(), narrow), hint.height())

    def is_elided(self) -> bool:
        """Whether the label is too narrow for its whole text."""
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def paintEvent(self, event: QPaintEvent) -> None:
        if not self.is_elided():
            super().paintEvent(event)
            return
        rect = self.contentsRect()
        shown = self.fontMetrics().elidedText(
            self.text(), Qt.TextElideMode.ElideRight, rect.width()
        )
        painter = QPainter(self)
        self.style().drawItemText(
            painter,
            rect,
            int(self.alignment()),
            self.palette(),
            self.isEnabled(),
            shown,
            QPalette.ColorRole.WindowText,
        )
        painter.end()

    def event(self, e: QEvent) -> bool:
        if e.type() == QEvent.Type.ToolTip and self.is_elided() and isinstance(e, QHelpEvent):
            tip = "\n\n".join(t for t in (self.text(), self.toolTip()) if t)
            QToolTip.showText(e.globalPos(), tip, self)
            return True
        return super().event(e)
