"""The model manager's Hub half: search, downloads and imports, and the Hub token.

Downloads and imports run as a :class:`HubTaskGroup`, as the first-run view's do.
"""

from __future__ import annotations

import re
from pathlib import Path

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.hub import human_count, human_size
from app.hub.catalog import mlx_runs_on_gpu
from app.hub.gguf_import import default_q_bits
from app.keychain import stored_token
from app.services.hub_service import HubFailure, HubSearchResult, HubService, Kind
from app.services.hub_tasks import GroupProgress, HubTaskGroup

RepoRole = Qt.ItemDataRole.UserRole + 3
REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
# How an import is stored: its bits, 0 for as it is.
IMPORT_AS = (("4-bit", 4), ("8-bit", 8), ("full precision", 0))
TOO_MANY_FILES = "Choose one GGUF file, or a model's file with its MTP head's file."


def choose_gguf(parent: QWidget) -> list[str]:
    """Asks for a GGUF file, or two: a model's and its MTP head's (llama.cpp can write
    them apart); empty when cancelled."""
    paths, _ = QFileDialog.getOpenFileNames(
        parent, "Import GGUF (with its MTP head's file, if apart)", "", "GGUF files (*.gguf)"
    )
    return paths


class HubPanel(QWidget):
    """Searches the Hub, downloads or imports a model, keeps the Hub token.

    Searches, downloads and imports run on the hub thread; the panel only shows
    them, and says through :attr:`model_added` when a model has landed.

    Args:
        hub: The Hub service; ``None`` leaves search, download and import off.
        models_dir: Tandem's models folder, where downloads and imports go.
        parent: The owning widget.

    Signals:
        model_added: A downloaded or imported model's folder, and whether it
            should become the draft.
    """

    model_added = Signal(str, bool)

    def __init__(
        self, hub: HubService | None, models_dir: Path, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.hub = hub
        # Downloads and imports, one at a time; a draft's download becomes the draft.
        self._downloads = HubTaskGroup(hub, models_dir, self) if hub is not None else None
        self._as_draft = False
        self._search: int | None = None
        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search mlx-community, or type a repo id (org/name)")
        self.search_edit.setAccessibleName("Search the Hugging Face Hub")
        self.search_edit.setClearButtonEnabled(True)
        self.search_button = QPushButton("Search")
        self.results = QListWidget()
        self.results.setAccessibleName("Search results")
        self.results.setMaximumHeight(120)
        self.results.hide()
        self.search_edit.returnPressed.connect(self._on_search_clicked)
        self.search_edit.textChanged.connect(self._on_search_text_changed)
        self.search_button.clicked.connect(self._on_search_clicked)
        self.results.currentItemChanged.connect(self._on_result_changed)
        self.results.itemActivated.connect(self._on_download_clicked)
        self.download_button = QPushButton("Download")
        self.import_button = QPushButton("Import GGUF…")
        self.import_folder_button = QPushButton("Import Folder…")
        self.import_as_label = QLabel("as")
        self.import_as = QComboBox()
        self.import_as.setAccessibleName("How imports are stored")
        self.import_as.setToolTip(
            "GGUF files are converted to this, and folders of unquantized weights quantized "
            "(an MTP head with them); a quantized folder is copied as it is."
        )
        for text, bits in IMPORT_AS:
            self.import_as.addItem(text, bits)
        bits = default_q_bits(mlx_runs_on_gpu()) or 0  # 0: as it is
        self.import_as.setCurrentIndex(self.import_as.findData(bits))
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Download or import progress")
        self.file_progress = QProgressBar()
        self.file_progress.setAccessibleName("Progress of the current file")
        self.file_progress.setRange(0, 1000)
        self.progress_label = QLabel()
        self.cancel_button = QPushButton("Cancel")
        self.token_edit = QLineEdit()
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText("Hugging Face token (kept in the keychain)")
        self.token_edit.setAccessibleName("Hugging Face token")
        self.token_button = QPushButton("Save Token")
        self.download_button.clicked.connect(self._on_download_clicked)
        self.import_button.clicked.connect(self._on_import_clicked)
        self.import_folder_button.clicked.connect(self._on_import_folder_clicked)
        self.cancel_button.clicked.connect(self._on_cancel_clicked)
        self.token_button.clicked.connect(self._on_save_token_clicked)
        for b in (self.download_button, self.import_button, self.import_folder_button):
            b.setEnabled(hub is not None)
        self.search_button.setEnabled(hub is not None)
        if hub is not None and self._downloads is not None:
            self._downloads.progressed.connect(self._on_download_progressed)
            self._downloads.finished.connect(self._on_download_finished)
            self._downloads.failed.connect(self._on_download_failed)
            hub.searched.connect(self._on_hub_searched)
            hub.failed.connect(self._on_hub_failed)
        self._set_running(False)
        self._init_token()
        self._lay_out()

    def _lay_out(self) -> None:
        layout = QVBoxLayout(self)
        # No margins: the rows sit in the dialog's layout as if they were its own.
        layout.setContentsMargins(0, 0, 0, 0)
        search_row = QHBoxLayout()
        search_row.addWidget(self.search_edit, 1)
        search_row.addWidget(self.search_button)
        search_row.addWidget(self.download_button)
        search_row.addWidget(self.import_button)
        search_row.addWidget(self.import_folder_button)
        search_row.addWidget(self.import_as_label)
        search_row.addWidget(self.import_as)
        layout.addLayout(search_row)
        layout.addWidget(self.results)
        hub_row = QHBoxLayout()
        hub_row.addWidget(self.progress_label, 1)
        hub_row.addWidget(self.file_progress, 1)
        hub_row.addWidget(self.progress, 1)
        hub_row.addWidget(self.cancel_button)
        layout.addLayout(hub_row)
        token_row = QHBoxLayout()
        token_row.addWidget(self.token_edit, 1)
        token_row.addWidget(self.token_button)
        layout.addLayout(token_row)

    def busy(self) -> bool:
        """Whether a download or import runs (one at a time)."""
        return self._downloads is not None and self._downloads.running

    def start_task(
        self, kind: Kind, source: str, q_bits: int | None = None, mtp: str | None = None
    ) -> None:
        """Downloads or imports one model into Tandem's folder.

        Args:
            kind: What to do with ``source``.
            source: A repo id, a GGUF file or a model folder.
            q_bits: Quantize an import to this many bits (``None``: as it is).
            mtp: A GGUF import's other file: its MTP head alone, or the model's own
                where ``source`` is the head (the hub tells them apart).
        """
        assert self._downloads is not None
        self._downloads.start([(kind, source)], q_bits, mtp)
        self.progress.setRange(0, 0)
        self.progress_label.setText(f"Starting {Path(source).name}…")
        self._set_running(True)

    def download_draft(self, repo_id: str) -> None:
        """Downloads a draft, which :attr:`model_added` then offers as the draft.

        Does nothing without a hub or while another download or import runs.

        Args:
            repo_id: The draft's Hub repo id.
        """
        if self.hub is not None and not self.busy():
            self.start_task("download", repo_id)
            self._as_draft = True  # becomes the draft once downloaded

    def _init_token(self) -> None:
        from app.keychain import TokenStoreError, get_token, keyring_status

        reason = keyring_status()
        if reason is not None:
            # No plaintext fallback: without a keychain there is no token field.
            self.token_edit.setEnabled(False)
            self.token_button.setEnabled(False)
            self.token_edit.setPlaceholderText(reason[:1].upper() + reason[1:])
            self.token_edit.setToolTip(reason)
            return
        try:
            stored = get_token()
        except TokenStoreError as exc:
            self.token_edit.setPlaceholderText(str(exc))
            return
        if stored:
            self.token_edit.setPlaceholderText("A token is stored in the keychain")

    @Slot()
    def _on_save_token_clicked(self) -> None:
        from app.keychain import TokenStoreError, delete_token, set_token

        text = self.token_edit.text().strip()
        try:
            if text:
                set_token(text)
            else:
                delete_token()
        except (TokenStoreError, ValueError) as exc:
            self.progress_label.setText(str(exc))
            return
        self.token_edit.clear()
        stored = "A token is stored in the keychain" if text else "No token stored"
        self.token_edit.setPlaceholderText(stored)

    def _set_running(self, running: bool) -> None:
        self.progress.setVisible(running)
        self.file_progress.setVisible(False)  # until a download names a file
        self.cancel_button.setVisible(running)
        for b in (self.import_button, self.import_folder_button, self.import_as):
            b.setEnabled(self.hub is not None and not running)
        self._update_download_button()

    def _repo_to_download(self) -> str | None:
        """The selected search result, else a repo id typed into the search field."""
        item = self.results.currentItem()
        if item is not None and self.results.isVisible():
            return str(item.data(RepoRole))
        text = self.search_edit.text().strip()
        return text if REPO_ID.match(text) else None

    def _update_download_button(self) -> None:
        ready = self.hub is not None and not self.busy()
        self.download_button.setEnabled(ready and self._repo_to_download() is not None)

    @Slot(str)
    def _on_search_text_changed(self, _text: str) -> None:
        self._update_download_button()

    @Slot(QListWidgetItem, QListWidgetItem)
    def _on_result_changed(self, _item: QListWidgetItem | None, _previous: object) -> None:
        self._update_download_button()

    @Slot()
    def _on_search_clicked(self) -> None:
        query = self.search_edit.text().strip()
        if self.hub is None:
            return
        if REPO_ID.match(query):  # a full repo id needs no search
            self._on_download_clicked()
            return
        self._search = self.hub.search(query, token=stored_token())
        self.progress_label.setText(f"Searching for “{query}”…" if query else "Searching…")

    @Slot(object)
    def _on_hub_searched(self, result: HubSearchResult) -> None:
        if result.task_id != self._search:
            return
        self._search = None
        self.results.clear()
        for repo in result.repos:
            gated = "  ·  license must be accepted on huggingface.co" if repo.gated else ""
            text = f"{repo.repo_id}  ·  {human_count(repo.downloads)} downloads{gated}"
            item = QListWidgetItem(text)
            item.setData(RepoRole, repo.repo_id)
            self.results.addItem(item)
        self.results.setVisible(bool(result.repos))
        found = len(result.repos)
        self.progress_label.setText(
            f"{found} model{'s' if found != 1 else ''} found" if found else "No models found"
        )
        self._update_download_button()

    @Slot()
    def _on_download_clicked(self) -> None:
        repo = self._repo_to_download()
        if repo is not None and self.hub is not None and not self.busy():
            self.start_task("download", repo)

    @Slot()
    def _on_import_clicked(self) -> None:
        paths = choose_gguf(self.window())
        if len(paths) > 2:
            self.progress_label.setText(TOO_MANY_FILES)
        elif paths:
            self.start_task(
                "import-gguf", paths[0], self._import_bits(), paths[1] if len(paths) == 2 else None
            )

    @Slot()
    def _on_import_folder_clicked(self) -> None:
        path = QFileDialog.getExistingDirectory(self.window(), "Import a model folder")
        if path:
            self.start_task("import-folder", path, self._import_bits())

    def _import_bits(self) -> int | None:
        return int(self.import_as.currentData()) or None

    @Slot()
    def _on_cancel_clicked(self) -> None:
        if self._downloads is not None:
            self._downloads.cancel()

    @Slot(object)
    def _on_download_progressed(self, g: GroupProgress) -> None:
        p = g.detail
        # Byte counts overflow a QProgressBar's int; show per mille.
        self.progress.setRange(0, 1000)
        self.progress.setValue(int(1000 * p.done / max(p.total, 1)))
        if p.file is not None and p.file_total > 0:
            self.file_progress.show()
            self.file_progress.setValue(int(1000 * p.file_done / p.file_total))
            self.file_progress.setFormat(f"{p.file} %p%")
            self.progress.setFormat(f"{human_size(p.done)} of {human_size(p.total)}")
            self.progress_label.setText(f"Downloading {p.file}")
        else:
            self.progress.setFormat("%p%")
            self.progress_label.setText(p.text)

    @Slot(object)
    def _on_download_finished(self, paths: tuple[str, ...]) -> None:
        [path] = paths
        self._set_running(False)
        self.progress_label.setText(f"Added {Path(path).name}")
        as_draft, self._as_draft = self._as_draft, False
        self.model_added.emit(path, as_draft)

    @Slot(object)
    def _on_hub_failed(self, failure: HubFailure) -> None:
        if failure.task_id == self._search:
            self._search = None
            self.progress_label.setText(failure.message)

    @Slot(str)
    def _on_download_failed(self, message: str) -> None:
        self._as_draft = False
        self._set_running(False)
        self.progress_label.setText(message)
