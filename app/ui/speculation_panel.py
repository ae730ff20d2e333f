"""The side panel: the live gauge, the draft length and the token colour legend."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from app.engine.live import LiveSnapshot
from app.engine.types import PARAM_RANGES, DraftSetting, Origin
from app.store import Settings
from app.ui.gauge import EMPTY_TEXT, NOT_REPORTED_TEXT, GaugeWidget
from app.ui.transcript import ORIGIN_COLORS, ORIGIN_LABELS

K_MAX = int(PARAM_RANGES["num_draft"].hi)  # the slider's right end: the longest draft planned


def k_label(setting: DraftSetting, auto_k: int | None = None) -> str:
    """What the draft setting means, in words.

    Args:
        setting: The setting shown.
        auto_k: The k Auto chose last; ``None`` before its first drafting round.
    """
    if setting.auto:
        return "auto" if auto_k is None else f"auto: {auto_k}"
    return "k: off" if setting.off else f"k: {setting.k}"


class SpeculationPanel(QWidget):
    """Shows speculation at work and sets how far the draft runs ahead."""

    drafting_changed = Signal(object)  # DraftSetting
    colour_toggled = Signal(bool)
    tune_requested = Signal()

    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("speculationPanel")
        self.gauge = GaugeWidget()
        self.k_slider = QSlider(Qt.Orientation.Horizontal)
        self.k_slider.setRange(0, K_MAX)
        self.k_slider.setPageStep(1)
        self.k_slider.setTickPosition(QSlider.TickPosition.TicksBelow)
        self.k_slider.setTickInterval(1)
        self.k_slider.setValue(settings.drafting.k)
        self.k_slider.setAccessibleName("Draft tokens per round")
        self.k_slider.setToolTip("Draft tokens per round (k); 0 turns speculation off")
        self.auto_check = QCheckBox("Auto")
        self.auto_check.setChecked(settings.drafting.auto)
        self.auto_check.setAccessibleName("Adapt draft length")
        self.auto_check.setToolTip("Pick k each round from measured acceptance and cost")
        self.k_value = QLabel()
        # Wide enough for the longest text, so the slider does not move as k changes.
        self.k_value.setMinimumWidth(self.k_value.fontMetrics().horizontalAdvance("auto: 16") + 4)
        self.k_value.setAccessibleName("Draft length")
        self._auto_k: int | None = None
        self.colour_check = QCheckBox("Colour tokens by origin")
        self.colour_check.setChecked(settings.colour_tokens)
        self.tune_button = QPushButton("Tune…")
        self.tune_button.setToolTip("Measure tok/s and acceptance for each k on this pair")

        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.addWidget(self.gauge)
        k_row = QHBoxLayout()
        k_row.addWidget(self.k_value)
        k_row.addWidget(self.k_slider, 1)
        k_row.addWidget(self.auto_check)
        layout.addLayout(k_row)
        layout.addWidget(self.tune_button, 0, Qt.AlignmentFlag.AlignRight)
        layout.addWidget(self.colour_check)
        self._own_head = False
        self.legend = QLabel(self._legend_html(own_head=False))
        self.legend.setAccessibleName("Token colour legend")
        self.legend.setWordWrap(True)
        layout.addWidget(self.legend)
        layout.addStretch(1)

        self.k_slider.valueChanged.connect(self._on_k_changed)
        self.auto_check.toggled.connect(self._on_k_changed)
        self.colour_check.toggled.connect(self._on_colour_toggled)
        self.tune_button.clicked.connect(self.tune_requested)
        self._sync()

    def drafting(self) -> DraftSetting:
        """The setting shown: the slider's k, and whether Auto plans instead."""
        return DraftSetting(self.k_slider.value(), auto=self.auto_check.isChecked())

    def set_drafting(self, setting: DraftSetting) -> None:
        """Shows ``setting``, as a preset does."""
        self.k_slider.setValue(setting.k)
        self.auto_check.setChecked(setting.auto)

    def show_pair(self, remote: bool) -> None:
        """Starts afresh for a newly loaded pair: no Auto k yet (its figures come from the model).

        Args:
            remote: A remote engine reports no acceptance and cannot be tuned.
        """
        self.show_auto_k(None)  # the last pair's choice says nothing of this one
        self.gauge.empty_text = NOT_REPORTED_TEXT if remote else EMPTY_TEXT
        self.tune_button.setEnabled(not remote)  # a sweep needs a local pair

    def show_snapshot(self, snapshot: LiveSnapshot | None) -> None:
        """Paints the gauge with ``snapshot``, and the legend for its drafter."""
        self.gauge.set_snapshot(snapshot)
        self._show_drafter(snapshot)

    def show_live(self, snapshot: LiveSnapshot | None) -> None:
        """Repaints the gauge, only while the panel is shown (no work while hidden); the
        legend names the pair's drafter either way."""
        if self.isVisible():
            self.gauge.set_snapshot(snapshot)
        self._show_drafter(snapshot)

    def _show_drafter(self, snapshot: LiveSnapshot | None) -> None:
        own_head = snapshot is not None and snapshot.own_head
        if own_head != self._own_head:
            self._own_head = own_head
            self.legend.setText(self._legend_html(own_head))

    def set_num_draft(self, k: int) -> None:
        """Sets a fixed k (for example the best one a calibration found)."""
        self.auto_check.setChecked(False)
        self.k_slider.setValue(k)

    def set_fixed_k(self, k: int) -> None:
        """Sets the k used while Auto is off, leaving Auto as it is."""
        self.k_slider.setValue(k)

    def show_auto_k(self, k: int | None) -> None:
        """Shows the k Auto chose in the latest drafting round ("auto: 8").

        Args:
            k: That k; ``None`` forgets it ("auto"), as for a newly loaded pair.
                Ignored while k is fixed (a round still in flight as Auto was
                turned off), and forgotten when Auto is turned off.
        """
        if self.auto_check.isChecked():
            self._auto_k = k
            self._sync()

    def _sync(self) -> None:
        self.k_slider.setEnabled(not self.auto_check.isChecked())
        self.k_value.setText(k_label(self.drafting(), self._auto_k))

    @Slot()
    def _on_k_changed(self) -> None:
        if not self.auto_check.isChecked():
            self._auto_k = None  # a k chosen before a fixed stretch says nothing of the next
        self._sync()
        self.drafting_changed.emit(self.drafting())

    @Slot(bool)
    def _on_colour_toggled(self, on: bool) -> None:
        self.legend.setEnabled(on)
        self.colour_toggled.emit(on)

    @staticmethod
    def _legend_html(own_head: bool) -> str:
        # The pair's drafter only: a draft model's accepted tokens, or its MTP head's.
        drafter = Origin.MTP if own_head else Origin.DRAFT
        order = (drafter, Origin.LOOKUP, Origin.CORRECTION, Origin.BONUS)
        items = []
        for origin in order:
            c = ORIGIN_COLORS[origin]
            swatch = f"rgba({c.red()},{c.green()},{c.blue()},{c.alphaF() * 2:.2f})"
            items.append(
                f'<td style="padding-right:10px"><span style="background:{swatch}">'
                "&nbsp;&nbsp;&nbsp;</span>&nbsp;"
                + ORIGIN_LABELS[origin].replace(" ", "&nbsp;")  # a label wraps whole
                + "</td>"
            )
        # Two columns: entries line up however narrow the panel, none left alone on a line.
        rows = ("<tr>" + "".join(items[i : i + 2]) + "</tr>" for i in range(0, len(items), 2))
        return '<table cellspacing="0" cellpadding="1">' + "".join(rows) + "</table>"
