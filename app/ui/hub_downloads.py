"""The model manager's Hub half: search, downloads and imports, and the Hub token.

Downloads and imports run as a :class:`HubTaskGroup`, as the first-run view's do.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import QFileDialog, QListWidgetItem

from app.hub import human_count, human_size
from app.keychain import stored_token
from app.services.hub_service import HubFailure, HubSearchResult, HubService, Kind
from app.services.hub_tasks import GroupProgress, HubTaskGroup

if TYPE_CHECKING:
    from PySide6.QtWidgets import QDialog, QLabel, QLineEdit, QListWidget, QProgressBar, QPushButton

    _Dialog = QDialog
else:
    _Dialog = object

RepoRole = Qt.ItemDataRole.UserRole + 3
REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


class HubDownloadsMixin(_Dialog):
    """Search the Hub, download or import a model, keep the Hub token."""

    if TYPE_CHECKING:
        hub: HubService | None
        draft: str
        _downloads: HubTaskGroup | None
        _as_draft: bool
        _search: int | None
        _models_dir: Path
        search_edit: QLineEdit
        search_button: QPushButton
        results: QListWidget
        download_button: QPushButton
        import_button: QPushButton
        import_folder_button: QPushButton
        progress: QProgressBar
        file_progress: QProgressBar
        progress_label: QLabel
        cancel_button: QPushButton
        token_edit: QLineEdit
        token_button: QPushButton

        def refresh(self) -> None: ...
        def _update_pair(self) -> None: ...

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
        for b in (self.import_button, self.import_folder_button):
            b.setEnabled(self.hub is not None and not running)
        self._update_download_button()

    def _repo_to_download(self) -> str | None:
        """The selected search result, else a repo id typed into the search field."""
        item = self.results.currentItem()
        if item is not None and self.results.isVisible():
            return str(item.data(RepoRole))
        text = self.search_edit.text().strip()
        return text if REPO_ID.match(text) else None

    @Slot()
    def _update_download_button(self) -> None:
        ready = self.hub is not None and not self._downloading()
        self.download_button.setEnabled(ready and self._repo_to_download() is not None)

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

    def _downloading(self) -> bool:
        """Whether a download or import runs (one at a time)."""
        return self._downloads is not None and self._downloads.running

    def start_task(self, kind: Kind, source: str, q_bits: int | None = None) -> None:
        """Downloads or imports one model into Tandem's folder."""
        assert self._downloads is not None
        self._downloads.start([(kind, source)], q_bits)
        self.progress.setRange(0, 0)
        self.progress_label.setText(f"Starting {Path(source).name}…")
        self._set_running(True)

    @Slot()
    def _on_download_clicked(self) -> None:
        repo = self._repo_to_download()
        if repo is not None and self.hub is not None and not self._downloading():
            self.start_task("download", repo)

    @Slot()
    def _on_import_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import GGUF", "", "GGUF files (*.gguf)")
        if path:
            self.start_task("import-gguf", path)

    @Slot()
    def _on_import_folder_clicked(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Import an MLX model folder")
        if path:
            self.start_task("import-folder", path)

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
        if self._as_draft:
            self._as_draft = False
            self.draft = path
            self._update_pair()
        self.refresh()

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
