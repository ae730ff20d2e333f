"""Settings (⌘,): the default pair and sampling, the data folder, clearing all data."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QUrl, Signal, Slot
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.store import Settings


def _spin(lo: float, hi: float, step: float, decimals: int, value: float) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(lo, hi)
    box.setSingleStep(step)
    box.setDecimals(decimals)
    box.setValue(value)
    return box


class SettingsDialog(QDialog):
    """Edits :class:`Settings`; clearing all data is asked for, never done here."""

    settings_changed = Signal(object)  # Settings
    clear_data_requested = Signal()

    def __init__(self, settings: Settings, data_dir: Path, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self._settings = settings
        self.data_dir = data_dir

        self.target_edit = self._path_edit(settings.target, "Target model folder")
        self.draft_edit = self._path_edit(settings.draft, "Draft model folder (optional)")
        pair = QFormLayout()
        pair.addRow("Target:", self._with_browse(self.target_edit, "target"))
        pair.addRow("Draft:", self._with_browse(self.draft_edit, "draft"))
        pair_box = QGroupBox("Default pair (loaded at start)")
        pair_box.setLayout(pair)

        self.temperature = _spin(0.0, 2.0, 0.1, 2, settings.temperature)
        self.top_p = _spin(0.0, 1.0, 0.05, 2, settings.top_p)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1000)
        self.top_k.setValue(settings.top_k)
        self.min_p = _spin(0.0, 1.0, 0.01, 2, settings.min_p)
        self.repetition_penalty = _spin(1.0, 2.0, 0.05, 2, settings.repetition_penalty)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 131_072)
        self.max_tokens.setValue(settings.max_tokens)
        self.seed = QLineEdit("" if settings.seed is None else str(settings.seed))
        self.seed.setPlaceholderText("random")
        self.top_k.setSpecialValueText("off")
        sampling = QFormLayout()
        for label, w, tip in (
            ("Temperature:", self.temperature, "0 gives the target's exact greedy reply"),
            ("Top-p:", self.top_p, "1 turns it off"),
            ("Top-k:", self.top_k, "0 turns it off"),
            ("Min-p:", self.min_p, "0 turns it off"),
            ("Repetition penalty:", self.repetition_penalty, "1 turns it off"),
            ("Max tokens:", self.max_tokens, "Longest reply"),
            ("Seed:", self.seed, "A number makes sampled replies reproducible"),
        ):
            w.setToolTip(tip)
            w.setAccessibleName(label.rstrip(":"))
            sampling.addRow(label, w)
        sampling_box = QGroupBox("Default sampling")
        sampling_box.setLayout(sampling)

        self.data_label = QLabel(str(data_dir))
        self.data_label.setTextInteractionFlags(self.data_label.textInteractionFlags())
        self.reveal_button = QPushButton("Reveal in Finder")
        self.clear_button = QPushButton("Clear All Data…")
        data_row = QHBoxLayout()
        data_row.addWidget(self.data_label, 1)
        data_row.addWidget(self.reveal_button)
        data = QVBoxLayout()
        data.addLayout(data_row)
        data.addWidget(self.clear_button)
        data_box = QGroupBox("Data folder (conversations and settings)")
        data_box.setLayout(data)

        self.error_label = QLabel()
        self.error_label.setStyleSheet("color: #c0392b;")
        self.error_label.hide()
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self._on_ok_clicked)
        buttons.rejected.connect(self.reject)
        self.reveal_button.clicked.connect(self._on_reveal_clicked)
        self.clear_button.clicked.connect(self._on_clear_clicked)

        layout = QVBoxLayout(self)
        for box in (pair_box, sampling_box, data_box):
            layout.addWidget(box)
        layout.addWidget(self.error_label)
        layout.addWidget(buttons)

    def _path_edit(self, value: str | None, placeholder: str) -> QLineEdit:
        edit = QLineEdit(value or "")
        edit.setPlaceholderText(placeholder)
        edit.setAccessibleName(placeholder)
        edit.setClearButtonEnabled(True)
        return edit

    def _with_browse(self, edit: QLineEdit, role: str) -> QWidget:
        row = QWidget()
        layout = QHBoxLayout(row)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(edit, 1)
        browse = QToolButton()
        browse.setText("…")
        browse.setAccessibleName(f"Choose the {role} folder")
        browse.clicked.connect(lambda: self._browse(edit, role))
        layout.addWidget(browse)
        return row

    def _browse(self, edit: QLineEdit, role: str) -> None:
        folder = QFileDialog.getExistingDirectory(self, f"Choose the {role} model folder")
        if folder:
            edit.setText(folder)

    def edited(self) -> Settings:
        """The settings as edited.

        Raises:
            ValueError: The seed is not a whole number.
        """
        seed_text = self.seed.text().strip()
        try:
            seed = int(seed_text) if seed_text else None
        except ValueError:
            raise ValueError("The seed must be a whole number, or empty for random.") from None
        return self._settings.updated(
            target=self.target_edit.text().strip() or None,
            draft=self.draft_edit.text().strip() or None,
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            top_k=self.top_k.value(),
            min_p=self.min_p.value(),
            repetition_penalty=self.repetition_penalty.value(),
            max_tokens=self.max_tokens.value(),
            seed=seed,
        )

    @Slot()
    def _on_ok_clicked(self) -> None:
        try:
            settings = self.edited()
        except ValueError as exc:
            self.error_label.setText(str(exc))
            self.error_label.show()
            return
        self.settings_changed.emit(settings)
        self.accept()

    @Slot()
    def _on_reveal_clicked(self) -> None:
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.data_dir)))

    @Slot()
    def _on_clear_clicked(self) -> None:
        answer = QMessageBox.warning(
            self,
            "Clear All Data",
            "Delete every conversation and reset all settings? Models are kept. "
            "This cannot be undone.",
            QMessageBox.StandardButton.Cancel | QMessageBox.StandardButton.Reset,
            QMessageBox.StandardButton.Cancel,
        )
        if answer == QMessageBox.StandardButton.Reset:
            self.clear_data_requested.emit()
            self.reject()
