"""The model bar: choose a target and an optional draft folder, lookup and temperature."""

from __future__ import annotations

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QToolButton,
    QWidget,
)

from app.store import Settings


class ModelBar(QWidget):
    """Picks the model pair and the decoding settings."""

    load_requested = Signal(str, str)  # target, draft ("" for none)
    models_requested = Signal()
    preset_activated = Signal(int)  # 0 is "Custom", 1 the first preset

    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
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

        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        for label, edit in (("Target", self.target_edit), ("Draft", self.draft_edit)):
            layout.addWidget(QLabel(label))
            layout.addWidget(edit, 1)
            browse = QToolButton()
            browse.setText("…")
            browse.setAccessibleName(f"Choose {label.lower()} folder")
            browse.clicked.connect(lambda _=False, e=edit, t=label: self._browse(e, t))
            layout.addWidget(browse)
        layout.addWidget(self.load_button)
        layout.addWidget(self.models_button)
        layout.addWidget(self.lookup_check)
        layout.addWidget(QLabel("Preset"))
        layout.addWidget(self.preset_combo)
        layout.addWidget(QLabel("Temp"))
        layout.addWidget(self.temp_spin)

    def _path_edit(self, placeholder: str, value: str | None) -> QLineEdit:
        edit = QLineEdit(value or "")
        edit.setPlaceholderText(placeholder)
        edit.setAccessibleName(placeholder)
        edit.setClearButtonEnabled(True)
        edit.returnPressed.connect(self._on_load_clicked)
        return edit

    def _browse(self, edit: QLineEdit, title: str) -> None:
        folder = QFileDialog.getExistingDirectory(self, f"Choose the {title.lower()} model folder")
        if folder:
            edit.setText(folder)

    @Slot()
    def _on_load_clicked(self) -> None:
        target = self.target_edit.text().strip()
        if target:
            self.load_requested.emit(target, self.draft_edit.text().strip())

    def request_load(self) -> None:
        """Asks to load the pair shown, as the Load button does."""
        if self.load_button.isEnabled():
            self._on_load_clicked()

    def target(self) -> str:
        """The target folder (or server address) typed or chosen, trimmed."""
        return self.target_edit.text().strip()

    def draft(self) -> str:
        """The draft folder, trimmed; ``""`` for none."""
        return self.draft_edit.text().strip()

    def set_pair(self, target: str, draft: str) -> None:
        """Shows a pair's folders, as when one is chosen in the library."""
        self.target_edit.setText(target)
        self.draft_edit.setText(draft)

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

    def set_loading(self, loading: bool) -> None:
        self.load_button.setEnabled(not loading)
        self.load_button.setText("Loading…" if loading else "Load")
