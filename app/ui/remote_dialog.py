"""Connects a remote engine: an OpenAI-compatible server that generates for Tandem."""

from __future__ import annotations

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.remote import SERVER_KINDS, RemoteEngine
from app.ui.fit import fit_placeholder


class RemoteEngineDialog(QDialog):
    """URL, server kind, model, optional draft and key; "Use Remote Engine" emits the target."""

    engine_chosen = Signal(str)  # RemoteEngine.to_target()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Remote Engine")
        self.url_edit = QLineEdit()
        self.url_edit.setPlaceholderText("http://studio.local:8080")
        self.kind_combo = QComboBox()
        self.kind_combo.addItems(list(SERVER_KINDS))
        self.kind_combo.setCurrentText("openai-compatible")
        self.model_edit = QLineEdit()
        self.model_edit.setPlaceholderText("as the server names it; empty for its default")
        self.draft_edit = QLineEdit()
        self.draft_edit.setPlaceholderText("mlx-lm and LM Studio: a draft the server loads")
        self.key_edit = QLineEdit()
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setPlaceholderText("optional bearer key, saved in the keychain")
        for edit in (self.url_edit, self.model_edit, self.draft_edit, self.key_edit):
            fit_placeholder(edit)  # each hint whole, however the dialog opens
        self.key_note = QLabel()
        self.key_note.setWordWrap(True)
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.use_button = QPushButton("Use Remote Engine")
        self.use_button.setDefault(True)
        box = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        box.addButton(self.use_button, QDialogButtonBox.ButtonRole.AcceptRole)
        box.rejected.connect(self.reject)
        self.use_button.clicked.connect(self._on_use_clicked)

        from app.keychain import keyring_status

        # Without a keychain there is nowhere safe for the key: say so, keep nothing.
        reason = keyring_status()
        self.key_edit.setEnabled(reason is None)
        self.key_note.setText(reason.replace("token", "key") if reason else "")
        self.key_note.setVisible(reason is not None)

        form = QFormLayout()
        form.addRow("Server URL", self.url_edit)
        form.addRow("Server kind", self.kind_combo)
        form.addRow("Model", self.model_edit)
        form.addRow("Draft model", self.draft_edit)
        form.addRow("Key", self.key_edit)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.key_note)
        layout.addWidget(self.error_label)
        layout.addWidget(box)

    def engine(self) -> RemoteEngine:
        """The engine the fields describe.

        Raises:
            ValueError: The URL is not an http(s) address.
        """
        return RemoteEngine(
            self.url_edit.text(),
            self.kind_combo.currentText(),  # type: ignore[arg-type]  # the combo holds only kinds
            self.model_edit.text().strip(),
            self.draft_edit.text().strip(),
        )

    @Slot()
    def _on_use_clicked(self) -> None:
        from app.keychain import TokenStoreError, set_remote_key

        try:
            engine = self.engine()
            key = self.key_edit.text().strip()
            if key and self.key_edit.isEnabled():
                set_remote_key(engine.url, key)
        except (ValueError, TokenStoreError) as exc:
            self.error_label.setText(str(exc))
            return
        self.engine_chosen.emit(engine.to_target())
        self.accept()
