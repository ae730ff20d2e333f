"""The model manager: the local library, pair checks, use and delete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QPersistentModelIndex,
    Qt,
    Signal,
    Slot,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.engine.loader import MTP
from app.engine.mtp import has_head
from app.errors import ModelError
from app.hub import (
    ModelInfo,
    check_pair,
    delete_model,
    human_count,
    human_size,
    refusal,
)
from app.hub.catalog import catalog_drafts, installed, load_catalog, suggest_drafts
from app.remote import is_remote_target, target_name
from app.services.hub_service import HubService
from app.services.library_scan import LibraryScan, LibraryScanner
from app.ui.empty_hint import HintTableView
from app.ui.hub_downloads import HubPanel
from app.ui.memory_bar import MemoryBar
from app.ui.remote_dialog import RemoteEngineDialog
from app.ui.target_edit import BUILT_IN, model_name

ModelInfoRole = Qt.ItemDataRole.UserRole + 1
DraftRole = Qt.ItemDataRole.UserRole + 2  # ("local", path) or ("catalog", repo id)


NO_MODELS_HINT = "No models yet: search the Hub below and Download, or Import GGUF…"
NO_HUB_HINT = "No models yet: put MLX model folders in Tandem's models folder"
SCANNING_HINT = "Scanning…"


def quantization_text(m: ModelInfo) -> str:
    """Says "4-bit (group 64)" for a quantized model, else its weights' dtype ("float32")."""
    if m.quantization:
        return f"{m.quantization[0]}-bit (group {m.quantization[1]})"
    return m.dtype or "—"


class ModelLibraryModel(QAbstractTableModel):
    """A thin table over :class:`ModelInfo` values."""

    COLUMNS = ("Name", "Architecture", "Parameters", "Quantization", "Size", "Context", "Chat")

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self._items: list[ModelInfo] = []

    def set_models(self, items: list[ModelInfo]) -> None:
        self.beginResetModel()
        self._items = list(items)
        self.endResetModel()

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._items)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = 0) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self.COLUMNS[section]
        return None

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = 0) -> Any:
        if not index.isValid():
            return None
        m = self._items[index.row()]
        if role == ModelInfoRole:
            return m
        if role == Qt.ItemDataRole.ToolTipRole:
            return m.problem or str(m.path)
        if role != Qt.ItemDataRole.DisplayRole:
            return None
        if m.problem and index.column() == 1:
            return f"⚠ {m.problem}"
        return (
            m.repo_id or m.name,
            m.architecture or "?",
            human_count(m.parameters) if m.parameters is not None else "?",
            quantization_text(m),
            human_size(m.size_bytes),
            f"{m.context_length:,}" if m.context_length else "?",
            "yes" if m.has_chat_template else "no",
        )[index.column()]

    def info_at(self, row: int) -> ModelInfo | None:
        return self._items[row] if 0 <= row < len(self._items) else None


class ModelManagerDialog(QDialog):
    """Lists the local library; picks a target and a draft; checks the pair."""

    pair_chosen = Signal(str, str)  # target, draft ("" for none)

    def __init__(
        self,
        models_dir: Path,
        hf_cache_dir: Path | None = None,
        target: str = "",
        draft: str = "",
        parent: QWidget | None = None,
        hub: HubService | None = None,
        loaded: tuple[str, ...] = (),
    ) -> None:
        super().__init__(parent)
        # The pair in memory stays there while a new one loads: the memory bar counts it.
        self._loaded = tuple(Path(p) for p in loaded if p)
        self.setWindowTitle("Models")
        self.resize(900, 480)
        self._models_dir = models_dir
        self._hf_cache_dir = hf_cache_dir
        self.target, self.draft = target, draft
        self.library = ModelLibraryModel(self)
        self.table = HintTableView()
        self.table.setModel(self.library)
        self._empty_hint = NO_MODELS_HINT if hub is not None else NO_HUB_HINT
        self.table.setAccessibleName("Model library")
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.verticalHeader().hide()
        self.pair_label = QLabel()
        self.pair_label.setWordWrap(True)
        self.pair_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.verdict_label = QLabel()
        self.verdict_label.setWordWrap(True)
        self.memory_bar = MemoryBar()
        self.memory_bar.hide()
        self.drafts_label = QLabel("Compatible drafts")
        self.draft_list = QListWidget()
        self.draft_list.setAccessibleName("Compatible drafts")
        self.draft_list.setMaximumHeight(120)
        self.draft_list.itemActivated.connect(self._on_draft_item_activated)
        self.draft_list.currentItemChanged.connect(self._on_draft_item_changed)
        self.use_draft_button = QPushButton("Use Draft")
        self.use_draft_button.setEnabled(False)
        self.use_draft_button.clicked.connect(self._on_use_draft_clicked)
        self._library: list[ModelInfo] = []
        self._others: list[ModelInfo] = []  # a target outside the library, described too
        # Reading every model's headers can take a while: never on the GUI thread.
        self._scanner = LibraryScanner(self)
        self._scanner.scanned.connect(self._on_library_scanned)
        self.target_button = QPushButton("Use as Target")
        self.draft_button = QPushButton("Use as Draft")
        self.no_draft_button = QPushButton("No Draft")
        self.delete_button = QPushButton("Delete…")
        self.refresh_button = QPushButton("Refresh")
        self.load_button = QPushButton("Load Pair")
        self.remote_button = QPushButton("Remote Engine…")
        self.load_button.setDefault(True)
        for button in (self.target_button, self.draft_button, self.delete_button):
            button.setEnabled(False)
        self.target_button.clicked.connect(self._on_use_as_target_clicked)
        self.draft_button.clicked.connect(self._on_use_as_draft_clicked)
        self.no_draft_button.clicked.connect(self._on_no_draft_clicked)
        self.delete_button.clicked.connect(self._on_delete_clicked)
        self.refresh_button.clicked.connect(self.refresh)
        self.load_button.clicked.connect(self._on_load_clicked)
        self.remote_button.clicked.connect(self._on_remote_clicked)
        self.table.selectionModel().selectionChanged.connect(self._on_selection_changed)

        # The Hub half says when a model lands; the dialog rescans and updates the pair.
        self.hub_panel = HubPanel(hub, models_dir)
        self.hub_panel.model_added.connect(self._on_model_added)

        buttons = QHBoxLayout()
        for b in (self.target_button, self.draft_button, self.no_draft_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        for b in (self.delete_button, self.refresh_button, self.remote_button, self.load_button):
            buttons.addWidget(b)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel(f"Tandem's models folder: {models_dir}"))
        layout.addWidget(self.table, 1)
        layout.addLayout(buttons)
        pair_row = QHBoxLayout()
        drafts = QVBoxLayout()
        drafts.addWidget(self.drafts_label)
        drafts.addWidget(self.draft_list)
        drafts.addWidget(self.use_draft_button, 0, Qt.AlignmentFlag.AlignLeft)
        pair_row.addLayout(drafts, 1)
        verdict = QVBoxLayout()
        verdict.addWidget(self.pair_label)
        verdict.addWidget(self.verdict_label)
        verdict.addWidget(self.memory_bar)
        verdict.addStretch(1)
        pair_row.addLayout(verdict, 1)
        layout.addLayout(pair_row)
        layout.addWidget(self.hub_panel)
        self.refresh()
        self._update_pair()

    @Slot()
    def refresh(self) -> None:
        """Rescans the library off the GUI thread; the list says so until the scan lands."""
        self._library = []
        self.library.set_models([])
        self.table.set_empty_hint(SCANNING_HINT)
        self._on_selection_changed()
        local = bool(self.target) and not is_remote_target(self.target)
        self._scanner.scan(
            self._models_dir, self._hf_cache_dir, (Path(self.target),) if local else ()
        )
        self._update_drafts()

    @Slot(object)
    def _on_library_scanned(self, scan: LibraryScan) -> None:
        self._library = list(scan.models)
        self._others = list(scan.others)
        self.library.set_models(self._library)
        hint = f"Could not read the library: {scan.error}" if scan.error else self._empty_hint
        self.table.set_empty_hint(hint)
        self._on_selection_changed()
        self._update_drafts()

    @property
    def scanning(self) -> bool:
        """Whether the list waits for a scan of the library."""
        return self._scanner.scanning

    def selected(self) -> ModelInfo | None:
        rows = self.table.selectionModel().selectedRows()
        return self.library.info_at(rows[0].row()) if rows else None

    @Slot()
    def _on_selection_changed(self) -> None:
        info = self.selected()
        usable = info is not None and info.problem is None
        self.target_button.setEnabled(usable)
        self.draft_button.setEnabled(usable)
        self.delete_button.setEnabled(info is not None)

    @Slot()
    def _on_use_as_target_clicked(self) -> None:
        if (info := self.selected()) is not None:
            self.target = str(info.path)
            self._update_pair()
            self._update_drafts()

    def _target_info(self) -> ModelInfo | None:
        if not self.target:
            return None
        for info in (*self._library, *self._others):
            if str(info.path) == self.target:
                return info
        return None  # not scanned yet, or remote: the scan describes local targets

    def _update_drafts(self) -> None:
        """Lists the library's compatible drafts, then the catalog's to download."""
        self.draft_list.clear()
        if self._scanner.scanning:
            self.drafts_label.setText("Compatible drafts: scanning the library…")
            return
        target = self._target_info()
        if target is None or not target.usable:
            self.drafts_label.setText("Compatible drafts: choose a target first")
            return
        local = suggest_drafts(target.path, self._library)
        if head := has_head(target.path):
            item = QListWidgetItem(f"{BUILT_IN}  ·  the target's own head, nothing to download")
            item.setData(DraftRole, ("local", MTP))
            self.draft_list.addItem(item)
        for info in local:
            item = QListWidgetItem(f"{info.repo_id or info.name}  ·  {human_size(info.size_bytes)}")
            item.setData(DraftRole, ("local", str(info.path)))
            self.draft_list.addItem(item)
        try:
            catalog = load_catalog()
        except ModelError:
            catalog = []
        offered = 0
        for pair in catalog_drafts(target, catalog):
            if installed(pair.draft, self._library) is not None:
                continue
            item = QListWidgetItem(f"{pair.draft}  ·  recommended, not downloaded")
            item.setData(DraftRole, ("catalog", pair.draft))
            item.setToolTip(f"{pair.name}: {pair.note} License: {pair.licenses[1]}.")
            self.draft_list.addItem(item)
            offered += 1
        name = target.repo_id or target.name
        if local or offered or head:
            self.drafts_label.setText(f"Compatible drafts for {name}")
        else:
            self.drafts_label.setText(f"No compatible draft for {name} in the library")

    @Slot(QListWidgetItem, QListWidgetItem)
    def _on_draft_item_changed(self, item: QListWidgetItem | None, _previous: Any) -> None:
        kind = item.data(DraftRole)[0] if item is not None else None
        self.use_draft_button.setEnabled(kind is not None)
        self.use_draft_button.setText("Download Draft" if kind == "catalog" else "Use Draft")

    @Slot()
    def _on_use_draft_clicked(self) -> None:
        if (item := self.draft_list.currentItem()) is not None:
            self._on_draft_item_activated(item)

    @Slot(QListWidgetItem)
    def _on_draft_item_activated(self, item: QListWidgetItem) -> None:
        kind, value = item.data(DraftRole)
        if kind == "local":
            self.draft = value
            self._update_pair()
        else:
            self.hub_panel.download_draft(value)

    @Slot(str, bool)
    def _on_model_added(self, path: str, as_draft: bool) -> None:
        if as_draft:
            self.draft = path
            self._update_pair()
        self.refresh()

    @Slot()
    def _on_use_as_draft_clicked(self) -> None:
        if (info := self.selected()) is not None:
            self.draft = str(info.path)
            self._update_pair()

    @Slot()
    def _on_no_draft_clicked(self) -> None:
        self.draft = ""
        self._update_pair()

    def _update_pair(self) -> None:
        t = target_name(self.target) if self.target else "none"  # a remote engine: its host
        d = model_name(self.draft) if self.draft else "none"
        self.pair_label.setText(f"Target: {t}    Draft: {d}")
        self.load_button.setEnabled(bool(self.target))
        self.memory_bar.set_fit(None)
        if not self.target:
            self.verdict_label.setText("")
            return
        from app.hub.fit import memory_fit

        try:
            fit = memory_fit(Path(self.target), self.draft or None, loaded=self._loaded)
            verdict = check_pair(Path(self.target), self.draft) if self.draft else None
        except (ModelError, OSError) as exc:
            self.verdict_label.setText(f"✗ {exc}")
            self.load_button.setEnabled(False)
            return
        self.memory_bar.set_fit(fit)
        # A pair that cannot fit or cannot be paired is not offered for loading.
        self.load_button.setEnabled(fit.fits and (verdict is None or verdict.compatible))
        if verdict is None:
            self.verdict_label.setText(
                "No draft: plain decoding." if fit.fits else f"✗ Does not fit: {fit.detail}"
            )
            return
        if not fit.fits:
            self.verdict_label.setText(f"✗ Does not fit in memory: {fit.detail}")
            return
        if verdict.compatible and verdict.warnings:
            self.verdict_label.setText("✓ Compatible pair; " + "; ".join(verdict.warnings))
        elif verdict.compatible:
            self.verdict_label.setText("✓ Compatible pair")
        else:
            self.verdict_label.setText(f"✗ Incompatible: {refusal(verdict)}")

    @Slot()
    def _on_delete_clicked(self) -> None:
        info = self.selected()
        if info is None:
            return
        answer = QMessageBox.question(
            self,
            "Delete Model",
            f"Delete {info.repo_id or info.name}? This frees {human_size(info.size_bytes)} "
            "and cannot be undone.",
            QMessageBox.StandardButton.Cancel | QMessageBox.StandardButton.Yes,
            QMessageBox.StandardButton.Cancel,
        )
        if answer != QMessageBox.StandardButton.Yes:
            return
        try:
            delete_model(info, models_dir=self._models_dir, hf_cache_dir=self._hf_cache_dir)
        except (OSError, ValueError) as exc:
            QMessageBox.warning(self, "Delete Model", f"Could not delete: {exc}")
        if str(info.path) in (self.target, self.draft):
            self.target = "" if self.target == str(info.path) else self.target
            self.draft = "" if self.draft == str(info.path) else self.draft
            self._update_pair()
        self.refresh()

    @Slot()
    def _on_load_clicked(self) -> None:
        if self.target:
            self.pair_chosen.emit(self.target, self.draft)
            self.accept()

    def remote_dialog(self) -> RemoteEngineDialog:
        """The remote engine dialog; choosing an engine emits ``pair_chosen(url, "")``."""
        dialog = RemoteEngineDialog(self)
        dialog.engine_chosen.connect(self._on_remote_chosen)
        return dialog

    @Slot()
    def _on_remote_clicked(self) -> None:
        self.remote_dialog().open()

    @Slot(str)
    def _on_remote_chosen(self, target: str) -> None:
        # The engine service reads an http(s) target as a remote engine.
        self.pair_chosen.emit(target, "")
        self.accept()
