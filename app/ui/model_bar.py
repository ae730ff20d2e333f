"""The model bar: choose a target and an optional draft by name, lookup and temperature."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from PySide6.QtCore import QSize, Signal, Slot
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QBoxLayout,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLayout,
    QMenu,
    QPushButton,
    QToolButton,
    QWidget,
)

from app.engine.loader import MTP
from app.engine.mtp import has_head
from app.store import Settings
from app.ui.target_edit import BUILT_IN, TargetEdit


class ModelBar(QWidget):
    """Picks the model pair and the decoding settings.

    It is one row when the window is wide enough for every field's whole
    placeholder, else two: the pair above, lookup, preset and temperature below.
    """

    load_requested = Signal(str, str)  # target, draft ("" for none)
    models_requested = Signal()
    preset_activated = Signal(int)  # 0 is "Custom", 1 the first preset

    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        # The library's models as (name, folder), offered by each field's picker.
        self._library: Callable[[], Sequence[tuple[str, Path]]] = list
        self.target_edit = self._path_edit("Target model folder", settings.target)
        self.draft_edit = self._path_edit("Draft model folder (optional)", settings.draft)
        self.load_button = QPushButton("Load")
        self.load_button.setAccessibleName("Load model pair")
        self.load_button.clicked.connect(self._on_load_clicked)
        self.models_button = QPushButton("Models…")
        self.models_button.setAccessibleName("Open the model library")
        self.models_button.clicked.connect(self.models_requested)
        self.lookup_check = QCheckBox("Lookup")
        self.lookup_check.setChecked(settings.prompt_lookup)
        self.lookup_check.setAccessibleName("Prompt lookup drafting")
        self.lookup_check.setToolTip(
            "Also propose tokens that continue text already in the conversation"
        )
        self.preset_combo = QComboBox()
        self.preset_combo.setAccessibleName("Preset")
        self.preset_combo.setToolTip("Sampling, draft settings and a system prompt, saved by name")
        self.preset_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.preset_combo.activated.connect(self.preset_activated)
        self.temp_spin = QDoubleSpinBox()
        self.temp_spin.setRange(0.0, 2.0)
        self.temp_spin.setSingleStep(0.1)
        self.temp_spin.setValue(settings.temperature)
        self.temp_spin.setAccessibleName("Temperature")
        self.temp_spin.setToolTip("0 gives the target's exact greedy reply")

        pair = QHBoxLayout()
        pickers: list[QToolButton] = []
        for label, edit in (("Target", self.target_edit), ("Draft", self.draft_edit)):
            pair.addWidget(QLabel(label))
            pair.addWidget(edit, 1)
            pick = QToolButton()
            pick.setText("▾")
            pick.setAccessibleName(f"Choose the {label.lower()} model")
            pick.setToolTip(f"Choose the {label.lower()} model from the library, or a folder")
            pick.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
            pick.setStyleSheet("QToolButton::menu-indicator { image: none; }")  # "▾" says it
            menu = QMenu(pick)
            menu.aboutToShow.connect(lambda m=menu, e=edit, t=label: self._fill_picker(m, e, t))
            pick.setMenu(menu)
            pair.addWidget(pick)
            pickers.append(pick)
        self.target_picker, self.draft_picker = pickers
        pair.addWidget(self.load_button)
        pair.addWidget(self.models_button)
        options = QHBoxLayout()
        options.addWidget(self.lookup_check)
        options.addWidget(QLabel("Preset"))
        options.addWidget(self.preset_combo)
        options.addWidget(QLabel("Temp"))
        options.addWidget(self.temp_spin)
        options.addStretch(1)  # on a row of their own, the options keep to the left
        self._pair_row, self._options_row = pair, options
        self._rows = QBoxLayout(QBoxLayout.Direction.LeftToRight, self)
        self._rows.setContentsMargins(8, 4, 8, 4)
        # The bar may be narrower than one row: it wraps then (see resizeEvent).
        self._rows.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)
        self._rows.addLayout(pair, 1)
        self._rows.addLayout(options)

    def _path_edit(self, placeholder: str, value: str | None) -> TargetEdit:
        edit = TargetEdit(placeholder)
        edit.set_target(value)
        edit.returnPressed.connect(self._on_load_clicked)
        return edit

    def one_row_width(self) -> int:
        """The narrowest width that fits the bar on one row, every field's text whole."""
        margins = self._rows.contentsMargins()
        return (
            _min_width(self._pair_row)
            + self._rows.spacing()
            + _min_width(self._options_row)
            + margins.left()
            + margins.right()
        )

    def minimumSizeHint(self) -> QSize:
        # Its least width is that of its wider row, on two rows.
        margins = self._rows.contentsMargins()
        rows = max(_min_width(self._pair_row), _min_width(self._options_row))
        return QSize(rows + margins.left() + margins.right(), super().minimumSizeHint().height())

    def is_one_row(self) -> bool:
        """Whether the options sit beside the pair rather than below it."""
        return self._rows.direction() == QBoxLayout.Direction.LeftToRight

    def resizeEvent(self, event: QResizeEvent) -> None:
        # Below its one-row width the bar wraps, so no field is cut down to "Target m…".
        wide = event.size().width() >= self.one_row_width()
        direction = QBoxLayout.Direction.LeftToRight if wide else QBoxLayout.Direction.TopToBottom
        if self._rows.direction() != direction:
            self._rows.setDirection(direction)
        super().resizeEvent(event)

    def set_library(self, library: Callable[[], Sequence[tuple[str, Path]]]) -> None:
        """Where the pickers find the library's models, as (name, folder), when opened."""
        self._library = library

    def _fill_picker(self, menu: QMenu, edit: TargetEdit, title: str) -> None:
        """The library's models by name (the folder in each tooltip), then a folder dialog."""
        menu.clear()
        menu.setToolTipsVisible(True)
        current = edit.target()
        for name, folder in self._library():
            action = menu.addAction(name)
            action.setToolTip(str(folder))
            action.setCheckable(True)
            action.setChecked(str(folder) == current)
            action.triggered.connect(lambda _=False, f=str(folder): edit.set_target(f))
        if title == "Draft" and has_head(Path(self.target())):
            action = menu.addAction(BUILT_IN)
            action.setToolTip("The target drafts for itself with its multi-token-prediction head")
            action.setCheckable(True)
            action.setChecked(current == MTP)
            action.triggered.connect(lambda _=False: edit.set_target(MTP))
        if not menu.isEmpty():
            menu.addSeparator()
        if title == "Draft":
            menu.addAction("No Draft", lambda: edit.set_target(""))
        menu.addAction("Choose Folder…", lambda: self._browse(edit, title))

    def _browse(self, edit: TargetEdit, title: str) -> None:
        folder = QFileDialog.getExistingDirectory(self, f"Choose the {title.lower()} model folder")
        if folder:
            edit.set_target(folder)

    @Slot()
    def _on_load_clicked(self) -> None:
        target = self.target()
        if target:
            self.load_requested.emit(target, self.draft())

    def request_load(self) -> None:
        """Asks to load the pair shown, as the Load button does."""
        if not self.is_loading():
            self._on_load_clicked()

    def target(self) -> str:
        """The target folder (or remote engine) typed or chosen, trimmed."""
        return self.target_edit.target()

    def draft(self) -> str:
        """The draft folder, trimmed; ``""`` for none."""
        return self.draft_edit.target()

    def set_pair(self, target: str, draft: str) -> None:
        """Shows a pair's folders, as when one is chosen in the library.

        A remote engine shows as its URL; :meth:`target` still gives it whole.
        """
        self.target_edit.set_target(target)
        self.draft_edit.set_target(draft)

    def uses_lookup(self) -> bool:
        """Whether prompt lookup proposes tokens too."""
        return self.lookup_check.isChecked()

    def set_lookup(self, on: bool) -> None:
        self.lookup_check.setChecked(on)

    def temperature(self) -> float:
        return self.temp_spin.value()

    def set_temperature(self, value: float) -> None:
        self.temp_spin.setValue(value)

    def set_presets(self, names: list[str]) -> None:
        """Lists "Custom" (the settings as they are), then the presets by name."""
        self.preset_combo.clear()
        self.preset_combo.addItem("Custom")
        self.preset_combo.addItems(names)

    def preset_index(self) -> int:
        """The preset chosen: 0 is "Custom", 1 the first preset."""
        return self.preset_combo.currentIndex()

    def show_preset(self, name: str) -> None:
        self.preset_combo.setCurrentText(name)

    def show_custom(self) -> None:
        """Shows "Custom": the settings are no preset's."""
        self.preset_combo.setCurrentIndex(0)

    def set_loading(self, loading: bool) -> None:
        self.load_button.setEnabled(not loading)
        self.load_button.setText("Loading…" if loading else "Load")

    def is_loading(self) -> bool:
        """Whether a load is under way (Load is then disabled)."""
        return not self.load_button.isEnabled()


def _min_width(row: QLayout) -> int:
    """A row's width with each widget at its minimum, as a box layout adds them up."""
    widths = []
    for i in range(row.count()):
        item = row.itemAt(i)
        w = item.widget() if item is not None else None
        if w is not None and not w.isHidden():
            widths.append(max(w.minimumSizeHint().width(), w.minimumWidth()))
    return sum(widths) + row.spacing() * max(len(widths) - 1, 0)
