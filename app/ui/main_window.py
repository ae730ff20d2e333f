"""Tandem's main window."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QItemSelectionModel, QModelIndex, QSettings, Qt, Slot
from PySide6.QtGui import QAction, QCloseEvent, QCursor, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListView,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSplitter,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.engine.live import LiveStats
from app.engine.loader import ModelError
from app.engine.types import FinishReason, GenerationParams, Message, Origin, Segment, Stats
from app.hub.catalog import CatalogPair
from app.hub.secrets import stored_token
from app.services import (
    EngineFailure,
    EngineService,
    GenerationResult,
    HubFailure,
    HubProgress,
    HubResult,
    HubService,
    LoadProgress,
    PairInfo,
    TokenBatch,
)
from app.store import Settings, SettingsFile, Store, pair_key
from app.ui.composer import Composer
from app.ui.conversation_model import ConversationIdRole, ConversationListModel
from app.ui.model_bar import ModelBar
from app.ui.model_manager import ModelManagerDialog
from app.ui.onboarding import OnboardingView
from app.ui.speculation_panel import SpeculationPanel
from app.ui.stats_popover import StatsPopover
from app.ui.transcript import TranscriptView

log = logging.getLogger(__name__)

TUNE_K_MAX = 8  # a sweep runs every k up to this, then auto


def format_stats(stats: Stats) -> tuple[str, str]:
    """Status bar texts for tok/s and acceptance."""
    tps = f"{stats.generation_tps:.1f} tok/s"
    if stats.speedup is not None and stats.drafted:
        tps += f" ({stats.speedup:.2f}× plain)"
    acc = stats.acceptance
    if acc is None:
        return tps, "no drafting"
    k = f"k {stats.k_min}–{stats.k_max}" if stats.k_min != stats.k_max else f"k {stats.k_max}"
    return tps, f"{acc:.0%} accepted ({stats.accepted}/{stats.drafted}), {k}"


class MainWindow(QMainWindow):
    """Conversation list, transcript, composer, model bar and status bar."""

    def __init__(
        self,
        store: Store,
        service: EngineService,
        settings_file: SettingsFile,
        parent: QWidget | None = None,
        models_dir: Path | None = None,
    ) -> None:
        super().__init__(parent)
        self._models_dir = models_dir
        self._hub: HubService | None = None
        self.setWindowTitle("Tandem")
        self.store = store
        self.service = service
        self._settings_file = settings_file
        self._settings: Settings = settings_file.load()
        self._pair: PairInfo | None = None
        self._conversation_id: int | None = None
        self._reply_conversation_id: int | None = None
        self._reply_request_id: int | None = None
        self._reply_text: list[str] = []
        self._reply_segments: list[Segment] = []
        self.live = LiveStats()
        self.tune_dialog: Any = None

        self.model_bar = ModelBar(self._settings)
        self.conversations = ConversationListModel(store, self)
        self.conversation_list = QListView()
        self.conversation_list.setModel(self.conversations)
        self.conversation_list.setAccessibleName("Conversations")
        self.conversation_list.setEditTriggers(QListView.EditTrigger.NoEditTriggers)
        self.new_button = QPushButton("New Chat")
        self.new_button.setAccessibleName("New conversation")
        self.delete_button = QPushButton("Delete")
        self.delete_button.setAccessibleName("Delete conversation")
        self.transcript = TranscriptView()
        self.transcript.colour = self._settings.colour_tokens
        self.panel = SpeculationPanel(self._settings)
        self.panel.setVisible(self._settings.show_speculation_panel)
        self.error_banner = QLabel()
        self.error_banner.setObjectName("errorBanner")
        self.error_banner.setWordWrap(True)
        self.error_banner.setStyleSheet(
            "#errorBanner { background: #c0392b; color: white; padding: 6px; border-radius: 4px; }"
        )
        self.error_banner.hide()
        self.composer = Composer()
        self.pair_label = QLabel("No model loaded")
        self.load_progress = QProgressBar()
        self.load_progress.setAccessibleName("Loading progress")
        self.load_progress.setMaximumWidth(160)
        self.load_progress.hide()
        self.tps_label = QLabel("")
        self.acceptance_label = QLabel("")

        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(6, 6, 0, 6)
        buttons = QHBoxLayout()
        buttons.addWidget(self.new_button)
        buttons.addWidget(self.delete_button)
        left_layout.addLayout(buttons)
        left_layout.addWidget(self.conversation_list, 1)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 6, 6, 6)
        right_layout.addWidget(self.transcript, 1)
        right_layout.addWidget(self.error_banner)
        right_layout.addWidget(self.composer)
        splitter = QSplitter()
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.addWidget(self.panel)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([220, 640, 260])
        central = QWidget()
        central_layout = QVBoxLayout(central)
        central_layout.setContentsMargins(0, 0, 0, 0)
        central_layout.addWidget(self.model_bar)
        self.pages = QStackedWidget()
        self.pages.addWidget(splitter)
        central_layout.addWidget(self.pages, 1)
        self.setCentralWidget(central)
        self.onboarding: OnboardingView | None = None
        self._onboarding_tasks: list[int] = []
        self._onboarding_paths: dict[int, str] = {}
        status = self.statusBar()
        status.addWidget(self.pair_label, 1)
        status.addPermanentWidget(self.load_progress)
        status.addPermanentWidget(self.tps_label)
        status.addPermanentWidget(self.acceptance_label)
        self._build_menus()

        self.new_button.clicked.connect(self._on_new_conversation_requested)
        self.delete_button.clicked.connect(self._on_delete_conversation_requested)
        self.conversation_list.selectionModel().currentChanged.connect(
            self._on_conversation_selected
        )
        self.composer.send_requested.connect(self._on_send_requested)
        self.composer.stop_requested.connect(self._on_stop_requested)
        self.model_bar.load_requested.connect(self._on_load_requested)
        self.model_bar.models_requested.connect(self.open_model_manager)
        self.panel.draft_length_changed.connect(self._on_draft_length_changed)
        self.panel.colour_toggled.connect(self._on_colour_toggled)
        self.panel.tune_requested.connect(self.open_tune_dialog)
        self.transcript.stats_requested.connect(self._on_stats_requested)
        service.generation_started.connect(self._on_generation_started)
        service.calibration_progressed.connect(self._on_calibration_progressed)
        service.calibration_finished.connect(self._on_calibration_finished)
        service.load_progressed.connect(self._on_load_progressed)
        service.pair_loaded.connect(self._on_pair_loaded)
        service.tokens_generated.connect(self._on_tokens_generated)
        service.generation_finished.connect(self._on_generation_finished)
        service.failed.connect(self._on_failed)

        self.resize(1100, 720)
        geometry = QSettings().value("window/geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        if self.conversations.rowCount():
            self._select_row(0)
        if not self.model_bar.target_edit.text().strip() and not self._library_has_models():
            self.show_onboarding()

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        new = QAction("&New Chat", self)
        new.setShortcut(QKeySequence.StandardKey.New)
        new.triggered.connect(self._on_new_conversation_requested)
        file_menu.addAction(new)
        models = QAction("&Models…", self)
        models.setShortcut(QKeySequence("Ctrl+Shift+M"))
        models.triggered.connect(self.open_model_manager)
        file_menu.addAction(models)
        view_menu = self.menuBar().addMenu("&View")
        self.panel_action = QAction("&Speculation Panel", self)
        self.panel_action.setCheckable(True)
        self.panel_action.setChecked(self._settings.show_speculation_panel)
        self.panel_action.setShortcut(QKeySequence("Ctrl+Alt+S"))
        self.panel_action.toggled.connect(self._on_panel_toggled)
        view_menu.addAction(self.panel_action)
        tune = QAction("&Tune Draft Length…", self)
        tune.triggered.connect(self.open_tune_dialog)
        view_menu.addAction(tune)
        quit_action = QAction("&Quit Tandem", self)
        quit_action.setShortcut(QKeySequence.StandardKey.Quit)
        quit_action.setMenuRole(QAction.MenuRole.QuitRole)
        quit_action.triggered.connect(self.close)
        file_menu.addAction(quit_action)

    # Conversations

    def _select_row(self, row: int) -> None:
        index = self.conversations.index(row, 0)
        self.conversation_list.selectionModel().setCurrentIndex(
            index, QItemSelectionModel.SelectionFlag.ClearAndSelect
        )

    @Slot()
    def _on_new_conversation_requested(self) -> None:
        self._conversation_id = None
        self.conversation_list.clearSelection()
        self.conversation_list.selectionModel().clearCurrentIndex()
        self.transcript.show_messages([])
        self.composer.editor.setFocus()

    @Slot(QModelIndex, QModelIndex)
    def _on_conversation_selected(self, current: QModelIndex, _previous: QModelIndex) -> None:
        cid = current.data(ConversationIdRole) if current.isValid() else None
        if cid is None or cid == self._conversation_id:
            return
        self._show_conversation(cid)

    def _show_conversation(self, conversation_id: int) -> None:
        self._conversation_id = conversation_id
        self.transcript.show_messages(self.store.messages(conversation_id))
        if self._reply_conversation_id == conversation_id:
            self.transcript.begin_reply()
            self.transcript.append_segments(self._reply_segments)

    @Slot()
    def _on_delete_conversation_requested(self) -> None:
        cid = self._conversation_id
        conversation = self.store.conversation(cid) if cid is not None else None
        if conversation is None or cid is None:
            return
        answer = QMessageBox.question(
            self,
            "Delete Conversation",
            f"Delete “{conversation.title}”? This cannot be undone.",
            QMessageBox.StandardButton.Cancel | QMessageBox.StandardButton.Yes,
            QMessageBox.StandardButton.Cancel,
        )
        if answer != QMessageBox.StandardButton.Yes:
            return
        if self._reply_conversation_id == cid:
            self.service.stop()
            self._reply_conversation_id = None
        self.store.delete_conversation(cid)
        self._conversation_id = None
        self.conversations.refresh()
        if self.conversations.rowCount():
            self._select_row(0)
        else:
            self.transcript.show_messages([])

    # Models

    @property
    def hub(self) -> HubService:
        """The downloads and imports thread, started on first use."""
        if self._hub is None:
            self.set_hub(HubService(self))
        assert self._hub is not None
        return self._hub

    def set_hub(self, hub: HubService) -> None:
        """Uses ``hub`` for downloads and imports (tests pass a fake)."""
        self._hub = hub
        hub.progressed.connect(self._on_hub_progressed)
        hub.finished.connect(self._on_hub_finished)
        hub.failed.connect(self._on_hub_failed)

    def models_dir(self) -> Path:
        from app.hub import default_models_dir

        return self._models_dir or default_models_dir()

    def _library_has_models(self) -> bool:
        from app.hub import scan_library

        try:
            return any(m.usable for m in scan_library(self.models_dir()))
        except OSError:
            return False

    # First run

    def show_onboarding(self) -> OnboardingView:
        """Shows the first-run view in place of the chat, with the pair for this Mac."""
        from app.hub.catalog import load_catalog, recommend
        from app.hub.fit import usable_memory_bytes

        try:
            usable = usable_memory_bytes()
        except OSError:
            usable = 0
        try:
            pair = recommend(load_catalog(), usable)
        except ModelError as exc:
            log.warning("no catalog: %s", exc)
            pair = None
        view = OnboardingView(pair, usable)
        view.download_requested.connect(self._on_onboarding_download_requested)
        view.cancel_requested.connect(self._on_onboarding_cancel_requested)
        view.import_requested.connect(self._on_onboarding_import_requested)
        view.models_requested.connect(self.open_model_manager)
        self.onboarding = view
        self.pages.addWidget(view)
        self.pages.setCurrentWidget(view)
        return view

    def _close_onboarding(self) -> None:
        if self.onboarding is not None:
            self.pages.setCurrentIndex(0)
            self.pages.removeWidget(self.onboarding)
            self.onboarding.deleteLater()
            self.onboarding = None
            self._onboarding_tasks, self._onboarding_paths = [], {}

    def start_onboarding_tasks(self, tasks: list[tuple[str, str]]) -> None:
        """Runs downloads or imports one after another for the first-run view."""
        assert self.onboarding is not None
        token = stored_token()
        self._onboarding_paths = {}
        self._onboarding_tasks = [
            self.hub.start(
                kind,  # type: ignore[arg-type]
                source,
                self.models_dir(),
                token=token if kind == "download" else None,
            )
            for kind, source in tasks
        ]
        self.onboarding.set_running(True)
        self.onboarding.show_progress(1, len(tasks), 0.0, f"Starting {tasks[0][1]}…")

    @Slot(object)
    def _on_onboarding_download_requested(self, pair: CatalogPair) -> None:
        self.start_onboarding_tasks([("download", pair.target), ("download", pair.draft)])

    @Slot(str)
    def _on_onboarding_import_requested(self, kind: str) -> None:
        if kind == "import-gguf":
            path, _ = QFileDialog.getOpenFileName(self, "Import GGUF", "", "GGUF files (*.gguf)")
        else:
            path = QFileDialog.getExistingDirectory(self, "Import an MLX model folder")
        if path:
            self.start_onboarding_tasks([(kind, path)])

    @Slot()
    def _on_onboarding_cancel_requested(self) -> None:
        for task in self._onboarding_tasks:
            self.hub.cancel(task)

    @Slot(object)
    def _on_hub_progressed(self, p: HubProgress) -> None:
        if self.onboarding is None or p.task_id not in self._onboarding_tasks:
            return
        step = self._onboarding_tasks.index(p.task_id) + 1
        fraction = p.done / p.total if p.total > 0 else 0.0
        self.onboarding.show_progress(step, len(self._onboarding_tasks), fraction, p.text)

    @Slot(object)
    def _on_hub_finished(self, result: HubResult) -> None:
        if self.onboarding is None or result.task_id not in self._onboarding_tasks:
            return
        self._onboarding_paths[result.task_id] = str(result.path)
        if len(self._onboarding_paths) < len(self._onboarding_tasks):
            return
        paths = [self._onboarding_paths[t] for t in self._onboarding_tasks]
        target, draft = paths[0], (paths[1] if len(paths) > 1 else "")
        self.onboarding.show_progress(len(paths), len(paths), 1.0, "Loading the models…")
        self._on_pair_chosen(target, draft)

    @Slot(object)
    def _on_hub_failed(self, failure: HubFailure) -> None:
        if self.onboarding is None or failure.task_id not in self._onboarding_tasks:
            return
        for task in self._onboarding_tasks:  # a pair is no use without both
            if task != failure.task_id and task not in self._onboarding_paths:
                self.hub.cancel(task)
        self._onboarding_tasks, self._onboarding_paths = [], {}
        self.onboarding.show_message(failure.message)

    @Slot()
    def open_model_manager(self) -> ModelManagerDialog:
        """Opens the library as a window-modal sheet."""
        from app.hub import default_models_dir

        dialog = ModelManagerDialog(
            self._models_dir or default_models_dir(),
            target=self.model_bar.target_edit.text().strip(),
            draft=self.model_bar.draft_edit.text().strip(),
            parent=self,
            hub=self.hub,
        )
        dialog.pair_chosen.connect(self._on_pair_chosen)
        dialog.open()
        return dialog

    @Slot(str, str)
    def _on_pair_chosen(self, target: str, draft: str) -> None:
        self.model_bar.target_edit.setText(target)
        self.model_bar.draft_edit.setText(draft)
        self._on_load_requested(target, draft)

    @Slot(str, str)
    def _on_load_requested(self, target: str, draft: str) -> None:
        # A reply in flight stops first; its text so far is kept as usual.
        self.service.stop()
        self.hide_error()
        self.model_bar.set_loading(True)
        self.pair_label.setText(f"Loading {Path(target).name}…")
        self.load_progress.setRange(0, 0)
        self.load_progress.show()
        self.service.load_pair(target, draft or None)

    @Slot(object)
    def _on_load_progressed(self, p: LoadProgress) -> None:
        self.load_progress.setRange(0, p.steps)
        self.load_progress.setValue(p.step)
        self.pair_label.setText(f"{p.text}…")

    @Slot(object)
    def _on_pair_loaded(self, info: PairInfo) -> None:
        self._pair = info
        self.model_bar.set_loading(False)
        self.load_progress.hide()
        self.pair_label.setText(info.label)
        self._close_onboarding()
        self.live.reset_pair()
        self.live.set_lifetime(*self.store.pair_totals(info.target, info.draft))
        self.panel.gauge.set_snapshot(self.live.snapshot())
        best = self._settings.best_k.get(pair_key(info.target, info.draft))
        if best is not None:  # the calibrated k is this pair's default
            self.panel.set_num_draft(best)
        self._save_settings(target=info.target, draft=info.draft)

    # Chat

    def params(self) -> GenerationParams:
        return GenerationParams(
            max_tokens=self._settings.max_tokens,
            temperature=self.model_bar.temp_spin.value(),
            num_draft=self.panel.num_draft(),
            prompt_lookup=self.model_bar.lookup_check.isChecked(),
        )

    @Slot(str)
    def _on_send_requested(self, text: str) -> None:
        if self.service.busy:
            return
        if self._pair is None:
            self.show_error("Load a target model first: choose its folder above and press Load.")
            return
        self.hide_error()
        if self._conversation_id is None:
            title = " ".join(text.split())[:48]
            self._conversation_id = self.store.create_conversation(title).id
        cid = self._conversation_id
        self.store.add_message(cid, "user", text)
        self.composer.clear()
        self.conversations.refresh()
        self._select_row(self.conversations.row_of(cid))
        self.transcript.append_message("user", text)
        history = [Message(m.role, m.content) for m in self.store.messages(cid)]
        self._reply_conversation_id = cid
        self._reply_text = []
        self._reply_segments = []
        self.transcript.begin_reply()
        self.composer.set_busy(True)
        self._reply_request_id = self.service.generate(history, self.params())
        self._save_settings(
            num_draft=self.panel.k_slider.value(),
            auto_draft=self.panel.auto_check.isChecked(),
            prompt_lookup=self.model_bar.lookup_check.isChecked(),
            temperature=self.model_bar.temp_spin.value(),
        )

    @Slot()
    def _on_stop_requested(self) -> None:
        self.service.stop()

    @Slot(object)
    def _on_tokens_generated(self, batch: TokenBatch) -> None:
        if batch.request_id != self._reply_request_id:
            return
        self._reply_text.append(batch.text)
        self._reply_segments += batch.segments
        if self._conversation_id == self._reply_conversation_id:
            self.transcript.append_segments(batch.segments)
        # Batches arrive at most about 30 times a second: one repaint each.
        self.live.add(batch.rounds, batch.baseline_tps)
        if self.panel.isVisible():
            self.panel.gauge.set_snapshot(self.live.snapshot())

    @Slot(object)
    def _on_generation_finished(self, result: GenerationResult) -> None:
        if result.request_id != self._reply_request_id:
            return
        f = result.finished
        self._save_reply(
            result.text, f.finish_reason, result.pair, f.stats, f.origins, result.segments
        )
        tps, acceptance = format_stats(f.stats)
        self.tps_label.setText(tps)
        self.acceptance_label.setText(acceptance)

    @Slot(object)
    def _on_failed(self, failure: EngineFailure) -> None:
        if failure.stage == "load":
            self.model_bar.set_loading(False)
            self.load_progress.hide()
            self.pair_label.setText(self._pair.label if self._pair else "No model loaded")
            if self.onboarding is not None:
                self.onboarding.show_message(failure.message)
        elif failure.stage == "calibrate":
            if self.tune_dialog is not None:
                self.tune_dialog.show_error(failure.message)
            self.composer.set_busy(False)
            return
        elif failure.request_id == self._reply_request_id:
            self._save_reply(
                failure.text, "error", self._pair, None, (), tuple(self._reply_segments)
            )
        self.show_error(failure.message)

    def _save_reply(
        self,
        text: str,
        reason: FinishReason,
        pair: PairInfo | None,
        stats: Stats | None,
        origins: tuple[Origin, ...],
        segments: tuple[Segment, ...] = (),
    ) -> None:
        cid = self._reply_conversation_id
        self._reply_request_id = None
        self._reply_conversation_id = None
        self._reply_text = []
        self._reply_segments = []
        self.composer.set_busy(False)
        if cid is None or self.store.conversation(cid) is None:
            return
        saved = None
        if text or reason != "error":
            if "".join(t for _, t in segments) != text:
                segments = ()  # partial runs would colour the wrong text
            saved = self.store.add_message(
                cid,
                "assistant",
                text,
                target=pair.target if pair else None,
                draft=pair.draft if pair else None,
                finish_reason=reason,
                stats=stats,
                origins=origins,
                segments=segments,
            )
        self.conversations.refresh()
        if cid == self._conversation_id:
            self._select_row(self.conversations.row_of(cid))
            note = {"cancelled": "Stopped.", "error": "Interrupted by an error."}.get(reason, "")
            stats_id = saved.id if saved is not None and stats is not None else None
            self.transcript.end_reply(note, stats_id)

    # Speculation panel

    @Slot(int)
    def _on_generation_started(self, request_id: int) -> None:
        if request_id == self._reply_request_id:
            self.live.begin_message()

    @Slot(object)
    def _on_draft_length_changed(self, num_draft: int | None) -> None:
        # The reply in flight takes it from its next round.
        self.service.set_draft_length(num_draft)
        self._save_settings(
            num_draft=self.panel.k_slider.value(), auto_draft=self.panel.auto_check.isChecked()
        )

    @Slot(bool)
    def _on_colour_toggled(self, on: bool) -> None:
        self.transcript.colour = on
        self._save_settings(colour_tokens=on)
        if self._conversation_id is not None and self._reply_request_id is None:
            self._show_conversation(self._conversation_id)

    @Slot(bool)
    def _on_panel_toggled(self, on: bool) -> None:
        self.panel.setVisible(on)
        if on:
            self.panel.gauge.set_snapshot(self.live.snapshot())
        self._save_settings(show_speculation_panel=on)

    @Slot(int)
    def _on_stats_requested(self, message_id: int) -> StatsPopover | None:
        m = self.store.message(message_id)
        if m is None or m.stats is None:
            return None
        popover = StatsPopover(m.stats, m.target, m.draft, self)
        popover.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        popover.show_at(QCursor.pos())
        return popover

    @Slot()
    def open_tune_dialog(self) -> Any:
        """Opens the draft-length calibration for the loaded pair."""
        from app.engine.bench import default_prompts
        from app.ui.tune_dialog import TuneDialog

        if self._pair is None:
            self.show_error("Load a model pair first, then tune its draft length.")
            return None
        if self._pair.draft is None and not self.model_bar.lookup_check.isChecked():
            self.show_error("Tuning needs a draft model: load a pair with a draft.")
            return None
        dialog = TuneDialog(
            self._pair.label, self.store.recent_prompts(), default_prompts(), parent=self
        )
        dialog.run_requested.connect(self._on_tune_run_requested)
        dialog.cancel_requested.connect(self.service.cancel_calibration)
        dialog.best_k_chosen.connect(self.panel.set_num_draft)
        self.tune_dialog = dialog
        dialog.open()
        return dialog

    @Slot(object)
    def _on_tune_run_requested(self, prompts: list[str]) -> None:
        if self.service.busy:
            self.tune_dialog.show_error("Wait for the reply to finish, or stop it, then run.")
            return
        self.composer.set_busy(True)
        self.service.calibrate(prompts, [*range(0, TUNE_K_MAX + 1), None])

    @Slot(object)
    def _on_calibration_progressed(self, progress: Any) -> None:
        if self.tune_dialog is not None:
            self.tune_dialog.show_progress(progress)

    @Slot(object)
    def _on_calibration_finished(self, result: Any) -> None:
        self.composer.set_busy(False)
        if self.tune_dialog is not None:
            if result is None:
                self.tune_dialog.set_running(False)
            else:
                self.tune_dialog.show_result(result)
        if result is not None and self._pair is not None:
            best = dict(self._settings.best_k)
            best[pair_key(self._pair.target, self._pair.draft)] = result.best_k
            self._save_settings(best_k=best)

    # Errors

    def show_error(self, message: str) -> None:
        self.error_banner.setText(message)
        self.error_banner.show()
        self.statusBar().showMessage(message, 10_000)

    def hide_error(self) -> None:
        self.error_banner.hide()

    # Lifetime

    def _save_settings(self, **changes: object) -> None:
        self._settings = self._settings.updated(**changes)
        try:
            self._settings_file.save(self._settings)
        except OSError as exc:
            log.warning("cannot save settings: %s", exc)

    def closeEvent(self, event: QCloseEvent) -> None:
        QSettings().setValue("window/geometry", self.saveGeometry())
        self.service.stop()
        if self._hub is not None:
            self._hub.shutdown()
        super().closeEvent(event)
