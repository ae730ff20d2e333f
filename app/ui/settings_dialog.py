"""Settings (⌘,): default pair and sampling, the local server, the data folder, clearing data."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QUrl, Signal, Slot
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QCheckBox,
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

from app.engine.types import PARAM_RANGES, check_param
from app.server.api_key import ApiKeyStoreError, get_api_key, key_storage_status, set_api_key
from app.server.security import ServerConfig, ServerConfigError, check_config
from app.store import Settings
from app.store.settings import origins
from app.ui.fit import fit_placeholder
from app.ui.target_edit import TargetEdit


def _spin(name: str, step: float, decimals: int, value: float) -> QDoubleSpinBox:
    """A box for the sampling field ``name``, over its range in :data:`PARAM_RANGES`."""
    box = QDoubleSpinBox()
    box.setRange(PARAM_RANGES[name].lo, PARAM_RANGES[name].hi)
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

        self.temperature = _spin("temperature", 0.1, 2, settings.temperature)
        self.top_p = _spin("top_p", 0.05, 2, settings.top_p)
        self.top_k = QSpinBox()
        self.top_k.setRange(int(PARAM_RANGES["top_k"].lo), int(PARAM_RANGES["top_k"].hi))
        self.top_k.setValue(settings.top_k)
        self.min_p = _spin("min_p", 0.01, 2, settings.min_p)
        self.repetition_penalty = _spin("repetition_penalty", 0.05, 2, settings.repetition_penalty)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(
            int(PARAM_RANGES["max_tokens"].lo), int(PARAM_RANGES["max_tokens"].hi)
        )
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

        server_box = self._server_box(settings)

        self.data_label = QLabel(str(data_dir))
        self.data_label.setTextInteractionFlags(self.data_label.textInteractionFlags())
        # Finder is the Mac's; elsewhere the folder opens in whatever file manager runs.
        reveal = "Reveal in Finder" if sys.platform == "darwin" else "Open Folder"
        self.reveal_button = QPushButton(reveal)
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
        for box in (pair_box, sampling_box, server_box, data_box):
            layout.addWidget(box)
        layout.addWidget(self.error_label)
        layout.addWidget(buttons)

    def _server_box(self, settings: Settings) -> QGroupBox:
        self.server_check = QCheckBox("Serve the loaded pair at an OpenAI-compatible URL")
        self.server_check.setChecked(settings.server_enabled)
        self.server_host = QLineEdit(settings.server_host)
        self.server_host.setAccessibleName("Server address")
        self.server_host.setToolTip("127.0.0.1 keeps the server to this Mac")
        self.server_port = QSpinBox()
        self.server_port.setRange(1, 65535)
        self.server_port.setValue(settings.server_port)
        self.server_port.setAccessibleName("Server port")
        self.server_origins = QLineEdit(settings.server_cors_origins)
        self.server_origins.setAccessibleName("Allowed web origins")
        self.server_origins.setPlaceholderText("loopback only, e.g. https://app.example")
        fit_placeholder(self.server_origins)
        self.server_origins.setToolTip(
            "Web pages at these origins may call the server, besides pages on this Mac; "
            "comma-separated, never *"
        )
        self.server_key = QLineEdit()
        self.server_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.server_key.setAccessibleName("Server API key")
        self.key_note = QLabel()
        self.key_note.setWordWrap(True)
        self._key_problem = key_storage_status()
        self._stored_key: str | None = None
        if self._key_problem is None:
            try:
                self._stored_key = get_api_key()
            except ApiKeyStoreError as exc:
                self._key_problem = str(exc)
        if self._key_problem is None:
            self.server_key.setText(self._stored_key or "")
            self.server_key.setPlaceholderText("none (loopback only)")
            self.key_note.setText(
                "Kept in the system keychain. Needed to listen on any address but 127.0.0.1."
            )
        else:
            self.server_key.setEnabled(False)
            self.server_key.setPlaceholderText("unavailable")
            self.key_note.setText(
                f"No API key can be kept ({self._key_problem}); the server listens "
                "on 127.0.0.1 only, without a key."
            )
        form = QFormLayout()
        form.addRow(self.server_check)
        form.addRow("Address:", self.server_host)
        form.addRow("Port:", self.server_port)
        form.addRow("API key:", self.server_key)
        form.addRow("Web origins:", self.server_origins)
        # Under the form, not in it: a form row gives a wrapped label the height of
        # its unwrapped text, and cuts its last line's descenders.
        column = QVBoxLayout()
        column.addLayout(form)
        column.addWidget(self.key_note)
        box = QGroupBox("Local server")
        box.setLayout(column)
        return box

    def _check_server(self) -> None:
        """Refuses a server setting the server itself would refuse, before saving it."""
        if not self.server_check.isChecked():
            return
        key = self.server_key.text().strip() if self._key_problem is None else ""
        config = ServerConfig(
            self.server_host.text().strip(),
            self.server_port.value(),
            key,
            origins(self.server_origins.text()),
        )
        try:
            check_config(config)
        except ServerConfigError as exc:
            raise ValueError(str(exc)) from None

    def _save_key(self) -> None:
        """Stores an edited API key in the keychain.

        Raises:
            ValueError: The key has whitespace inside, or the keychain refused it.
        """
        if self._key_problem is not None:
            return
        key = self.server_key.text().strip() or None
        if key == self._stored_key:
            return
        try:
            set_api_key(key)
        except ApiKeyStoreError as exc:
            raise ValueError(f"The API key was not saved: {exc}") from None
        self._stored_key = key

    def _path_edit(self, value: str | None, placeholder: str) -> TargetEdit:
        edit = TargetEdit(placeholder)
        edit.set_target(value)  # a remote engine shows as its URL
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
            ValueError: The seed is not a whole number in its range.
        """
        seed_text = self.seed.text().strip()
        try:
            seed = int(seed_text) if seed_text else None
            check_param("seed", seed)
        except ValueError:  # InvalidParamError is one
            rule = PARAM_RANGES["seed"].rule
            raise ValueError(f"The seed must be {rule}, or empty for random.") from None
        return self._settings.updated(
            target=self.target_edit.target() or None,
            draft=self.draft_edit.target() or None,
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            top_k=self.top_k.value(),
            min_p=self.min_p.value(),
            repetition_penalty=self.repetition_penalty.value(),
            max_tokens=self.max_tokens.value(),
            seed=seed,
            server_enabled=self.server_check.isChecked(),
            server_host=self.server_host.text().strip() or "127.0.0.1",
            server_port=self.server_port.value(),
            server_cors_origins=", ".join(origins(self.server_origins.text())),
        )

    @Slot()
    def _on_ok_clicked(self) -> None:
        try:
            settings = self.edited()
            self._check_server()
            self._save_key()
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
