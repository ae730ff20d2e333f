"""Item views that say, centred in their empty viewport, what would fill them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtGui import QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import QListView, QTableView

if TYPE_CHECKING:
    from PySide6.QtWidgets import QAbstractItemView

    _View = QAbstractItemView
else:
    _View = object

MARGIN = 12  # px between the hint and the viewport's edges


class EmptyHintMixin(_View):
    """Paints a short muted hint over the view while its model has no rows."""

    _hint = ""

    def set_empty_hint(self, text: str) -> None:
        """What the view says while it is empty ("" says nothing)."""
        self._hint = text
        self.viewport().update()

    def empty_hint(self) -> str:
        """The hint shown now: "" while the model has rows."""
        model = self.model()
        return self._hint if model is not None and model.rowCount() == 0 else ""

    def paintEvent(self, event: QPaintEvent) -> None:
        super().paintEvent(event)  # the Qt view's own paint
        if not (text := self.empty_hint()):
            return
        painter = QPainter(self.viewport())
        painter.setPen(self.palette().color(QPalette.ColorRole.PlaceholderText))
        rect = self.viewport().rect().adjusted(MARGIN, MARGIN, -MARGIN, -MARGIN)
        flags = Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap
        painter.drawText(rect, int(flags), text)
        painter.end()


class HintListView(EmptyHintMixin, QListView):
    """A list view with an empty-state hint."""


class HintTableView(EmptyHintMixin, QTableView):
    """A table view with an empty-state hint."""
