"""Tandem's main window."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import (
    QByteArray,
    QEvent,
    QItemSelectionModel,
    QModelIndex,
    QSettings,
    Qt,
    QTimer,
    Slot,
)
from PySide6.QtGui import QAction, QCloseEvent, QCursor, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListView,
    QMainWindow,
    QMenu,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSplitter,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.engine.costs import K_MAX
from app.engine.live import LiveStats
from app.engine.loader import ModelError, first_line
from app.engine.types import FinishReason, GenerationParams, Message, Origin, Segment, Stats
from app.hub.catalog import CatalogPair
from app.hub.secrets import stored_token
from app.server.api_key import ApiKeyStoreError, get_api_key
from app.server.security import ServerConfig, ServerConfigError
from app.services import (
    CalibrationHandle,
    EngineFailure,
    EngineService,
    GenerationResult,
    HubFailure,
    HubProgress,
    HubResult,
    HubService,
    LoadProgress,
    PairInfo,
    ReplyHandle,
    TokenBatch,
)
from app.services.server_service import ServerService
from app.store import Settings, SettingsFile, Store, StoredMessage, pair_key
from app.store.calibrations import CalibrationsFile
from app.store.presets import Preset, PresetsFile
from app.store.settings import origins
from app.ui.composer import Composer
from app.ui.conversation_model import ConversationIdRole, ConversationListModel
from app.ui.gauge import EMPTY_TEXT, NOT_REPORTED_TEXT
from app.ui.model_bar import ModelBar
from app.ui.model_manager import ModelManagerDialog
from app.ui.onboarding import OnboardingView
from app.ui.server_panel import ClickableLabel, ServerPanel
from app.ui.settings_dialog import SettingsDialog
from app.ui.speculation_panel import SpeculationPanel
from app.ui.stats_popover import StatsPopover
from app.ui.transcript import TranscriptView

log = logging.getLogger(__name__)

HELP_TEXT = """<b>Tandem Help</b>
<p>Load a <i>target</i> model and a smaller <i>draft</i> of the same family (Models…,
⇧⌘M). The draft proposes tokens, the target checks them all in one pass: the reply is
exactly the target's, only faster.</p>
<table>
<tr><td>⌘N</td><td>New chat</td></tr>
<tr><td>⌘↩</td><td>Send</td></tr>
<tr><td>Esc</td><td>Stop the reply</td></tr>
<tr><td>⇧⌘M</td><td>Models</td></tr>
<tr><td>⌥⌘S</td><td>Show or hide the speculation panel</td></tr>
<tr><td>⌘,</td><td>Settings</td></tr>
</table>
<p>The speculation panel shows how many drafted tokens the target accepts. With Auto on,
each round drafts as many tokens as pay best on this machine; untick it to fix k with the
slider. Tune… measures what verification costs and the speed of each k.</p>"""
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "max_tokens",
    "seed",
)
PAIR_FIELDS = ("target", "draft")
SERVER_FIELDS = ("server_enabled", "server_host", "server_port", "server_cors_origins")
CONTEXT_WARNING = 0.85  # share of the window past which the indicator warns
# Seconds between saves of a streaming reply: a crash or kill keeps it up to its last save.
REPLY_SAVE_INTERVAL = 2.0

# The sweep's draft lengths, then auto: every short k, then every second one up to the
# longest, so a slow Mac finishes in minutes.
TUNE_KS: tuple[int | None, ...] = (0, 1, 2, 3, 4, 5, 6, *range(8, K_MAX + 1, 2), None)


def _matching(segments: tuple[Segment, ...], text: str) -> tuple[Segment, ...]:
    """``segments`` when they spell ``text``; partial runs would colour the wrong text."""
    return segments if "".join(t for _, t in segments) == text else ()


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
        # The window's own reply and calibration: Stop reaches these, never the server's.
        self._reply: ReplyHandle | None = None
        self._calibration: CalibrationHandle | None = None
        self._reply_text: list[str] = []
        self._reply_segments: list[Segment] = []
        self._reply_parent_id: int | None = None
        self._reply_message_id: int | None = None  # the streaming reply, once saved
        self._reply_saved_at = 0.0
        self._pending_system_prompt: str | None = None
        self._context_used = 0
        self.live = LiveStats(max_positions=K_MAX)  # every position a draft can reach
        self.tune_dialog: Any = None

        self.model_bar = ModelBar(self._settings)
        self._presets_file = PresetsFile(settings_file.path.parent / "presets.json")
        self._calibrations = CalibrationsFile(settings_file.path.parent / "calibrations.json")
        self.presets: list[Preset] = self._presets_file.load()
        self._fill_presets()
        self.conversations = ConversationListModel(store, self)
        self.conversation_list = QListView()
        self.conversation_list.setModel(self.conversations)
        self.conversation_list.setAccessibleName("Conversations")
        self.conversation_list.setEditTriggers(QListView.EditTrigger.NoEditTriggers)
        # Long titles end in "…" rather than scrolling sideways.
        self.conversation_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conversation_list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.new_button = QPushButton("New Chat")
        self.new_button.setAccessibleName("New conversation")
        self.delete_button = QPushButton("Delete")
        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search all chats")
        self.search_edit.setAccessibleName("Search all chats")
        self.search_edit.setClearButtonEnabled(True)
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(150)
        self._search_timer.timeout.connect(self._on_search_timeout)
        self.search_edit.textChanged.connect(self._on_search_text_changed)
        self.conversation_list.setContextMenuPolicy(Qt.ContextMenuPolicy.ActionsContextMenu)
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
        self.context_label = QLabel("")
        self.context_label.setAccessibleName("Context used")
        self.tps_label = QLabel("")
        self.acceptance_label = QLabel("")

        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(6, 6, 0, 6)
        buttons = QHBoxLayout()
        buttons.addWidget(self.new_button)
        buttons.addWidget(self.delete_button)
        left_layout.addLayout(buttons)
        left_layout.addWidget(self.search_edit)
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
        status.addPermanentWidget(self.context_label)
        status.addPermanentWidget(self.tps_label)
        status.addPermanentWidget(self.acceptance_label)
        # The local server (off by default) answers with the window's sampling defaults.
        self.server = ServerService(service, defaults=self.params, parent=self)
        self.server_label = ClickableLabel()
        self.server_label.setAccessibleName("Local server")
        self.server_label.hide()
        self.server_label.clicked.connect(self.open_server_panel)
        status.addPermanentWidget(self.server_label)
        # Made now, shown on demand, so it has the requests served before it opens.
        self.server_panel = ServerPanel(self)
        self.server.running_changed.connect(self._show_server)
        self.server.requests_changed.connect(self._show_server)
        self.server.request_logged.connect(self.server_panel.add_request)
        if self._settings.server_enabled:
            QTimer.singleShot(0, self.apply_server_settings)  # once the event loop runs
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
        self.model_bar.preset_combo.activated.connect(self._on_preset_activated)
        self.panel.draft_length_changed.connect(self._on_draft_length_changed)
        self.panel.colour_toggled.connect(self._on_colour_toggled)
        self.panel.tune_requested.connect(self.open_tune_dialog)
        self.transcript.stats_requested.connect(self._on_stats_requested)
        self.transcript.copy_requested.connect(self._on_copy_requested)
        self.transcript.edit_requested.connect(self._on_edit_requested)
        self.transcript.regenerate_requested.connect(self._on_regenerate_requested)
        self.transcript.delete_requested.connect(self._on_delete_message_requested)
        self.transcript.branch_requested.connect(self._on_branch_requested)
        self.transcript.code_copied.connect(
            lambda _code: self.statusBar().showMessage("Code copied.", 3_000)
        )
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

    def _action(
        self,
        menu: QMenu,
        text: str,
        slot: Callable[..., object],
        shortcut: QKeySequence | QKeySequence.StandardKey | str | None = None,
        role: QAction.MenuRole | None = None,
    ) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        if role is not None:
            action.setMenuRole(role)  # macOS moves it into the Tandem menu
        action.triggered.connect(slot)
        menu.addAction(action)
        return action

    def _build_menus(self) -> None:
        keys = QKeySequence.StandardKey
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        self._action(file_menu, "&New Chat", self._on_new_conversation_requested, keys.New)
        self.file_menu = file_menu
        chat_actions = [
            self._action(file_menu, "&Rename Chat…", self._on_rename_conversation_requested),
            self._action(
                file_menu, "D&uplicate Chat", self._on_duplicate_conversation_requested, "Ctrl+D"
            ),
            self._action(file_menu, "S&ystem Prompt…", self._on_system_prompt_requested),
            self._action(
                file_menu, "&Export Chat…", self._on_export_conversation_requested, "Ctrl+E"
            ),
            self._action(
                file_menu, "&Delete Chat…", self._on_delete_conversation_requested, "Ctrl+Backspace"
            ),
        ]
        for action in chat_actions:
            self.conversation_list.addAction(action)  # the list's context menu
        file_menu.addSeparator()
        self._action(file_menu, "Export &All Chats…", self._on_export_all_requested)
        self._action(file_menu, "&Import Chats…", self._on_import_requested)
        file_menu.addSeparator()
        self._action(file_menu, "&Models…", self.open_model_manager, "Ctrl+Shift+M")
        file_menu.addSeparator()
        self._action(file_menu, "&Close Window", self.close, keys.Close)
        self._action(
            file_menu,
            "Settings…",
            self.open_settings,
            keys.Preferences,
            QAction.MenuRole.PreferencesRole,
        )
        self._action(file_menu, "&Quit Tandem", self.close, keys.Quit, QAction.MenuRole.QuitRole)

        edit = bar.addMenu("&Edit")
        for text, key, slot in (
            ("&Undo", keys.Undo, "undo"),
            ("&Redo", keys.Redo, "redo"),
            (None, None, None),
            ("Cu&t", keys.Cut, "cut"),
            ("&Copy", keys.Copy, "copy"),
            ("&Paste", keys.Paste, "paste"),
            ("Select &All", keys.SelectAll, "selectAll"),
        ):
            if text is None:
                edit.addSeparator()
                continue
            # The focused text field does the work, as in any Mac app.
            self._action(edit, text, lambda _=False, m=slot: self._edit(m), key)
        self.edit_menu = edit
        edit.addSeparator()
        self._action(edit, "&Find in Chats", self._on_find_requested, keys.Find)

        view = bar.addMenu("&View")
        self.panel_action = QAction("&Speculation Panel", self)
        self.panel_action.setCheckable(True)
        self.panel_action.setChecked(self._settings.show_speculation_panel)
        self.panel_action.setShortcut(QKeySequence("Ctrl+Alt+S"))
        self.panel_action.toggled.connect(self._on_panel_toggled)
        view.addAction(self.panel_action)
        self._action(view, "&Tune Draft Length…", self.open_tune_dialog)
        self.server_panel_action = self._action(view, "&Local Server…", self.open_server_panel)
        view.addSeparator()
        self._action(view, "Save Settings as &Preset…", self._on_save_preset_requested)
        self._action(view, "&Delete Preset", self._on_delete_preset_requested)

        window = bar.addMenu("&Window")
        self._action(window, "&Minimize", self.showMinimized, "Ctrl+M")
        self._action(window, "&Zoom", self._on_zoom_requested)

        help_menu = bar.addMenu("&Help")
        self._action(help_menu, "Tandem &Help", self._on_help_requested, keys.HelpContents)
        self._action(
            help_menu, "&About Tandem", self._on_about_requested, role=QAction.MenuRole.AboutRole
        )

    def _edit(self, method: str) -> None:
        widget = QApplication.focusWidget()
        if widget is not None and hasattr(widget, method):
            getattr(widget, method)()

    @Slot()
    def _on_zoom_requested(self) -> None:
        self.showNormal() if self.isMaximized() else self.showMaximized()

    @Slot()
    def _on_help_requested(self) -> None:
        QMessageBox.information(self, "Tandem Help", HELP_TEXT)

    @Slot()
    def _on_about_requested(self) -> None:
        from app import __version__

        QMessageBox.about(
            self,
            "About Tandem",
            f"<b>Tandem</b> {__version__}<br>Private, local chat on your Mac. A small draft "
            "model proposes tokens, the large target model checks them, and you get the "
            "target's exact reply, faster.",
        )

    @Slot()
    def open_settings(self) -> SettingsDialog:
        """Opens Settings (⌘,)."""
        dialog = SettingsDialog(self._settings, self._settings_file.path.parent, self)
        dialog.settings_changed.connect(self._on_settings_changed)
        dialog.clear_data_requested.connect(self._on_clear_data_requested)
        dialog.open()
        return dialog

    @Slot(object)
    def _on_settings_changed(self, settings: Settings) -> None:
        server_before = tuple(getattr(self._settings, f) for f in SERVER_FIELDS)
        fields = SAMPLING_FIELDS + PAIR_FIELDS + SERVER_FIELDS
        self._save_settings(**{f: getattr(settings, f) for f in fields})
        self.model_bar.temp_spin.setValue(settings.temperature)
        # Restart on any server change: the API key may have changed too.
        if settings.server_enabled or server_before[0]:
            self.apply_server_settings()

    # Local server

    def apply_server_settings(self) -> asyncio.Future[None]:
        """Starts, restarts or stops the local server as the settings say."""
        return asyncio.ensure_future(self._apply_server())

    async def _apply_server(self) -> None:
        s = self._settings
        if not s.server_enabled:
            await self.server.stop()
            return
        try:
            key = get_api_key()
        except ApiKeyStoreError as exc:
            log.warning("no server API key: %s", exc)
            key = None
        try:
            config = ServerConfig(s.server_host, s.server_port, key, origins(s.server_cors_origins))
            await self.server.start(config)
        except (ServerConfigError, OSError) as exc:
            self.show_error(f"The local server did not start: {exc}")

    @Slot()
    def _show_server(self, *_: object) -> None:
        url = self.server.url
        count = self.server.request_count
        self.server_label.setText(f"Serving {url} · {count} request{'s' if count != 1 else ''}")
        self.server_label.setToolTip("Tandem's OpenAI-compatible server; click for its key and log")
        self.server_label.setVisible(bool(url))
        self.server_panel.set_server(url, self.server.api_key)

    @Slot()
    def open_server_panel(self) -> ServerPanel:
        """Shows the local server's URL, key and recent requests (modeless)."""
        self.server_panel.set_server(self.server.url, self.server.api_key)
        self.server_panel.show()
        self.server_panel.raise_()
        self.server_panel.activateWindow()
        return self.server_panel

    @Slot()
    def _on_clear_data_requested(self) -> None:
        self._stop_own_work()
        for c in self.store.conversations():
            self.store.delete_conversation(c.id)
        self._conversation_id = None
        self.conversations.refresh()
        self.transcript.show_messages([])
        self._settings = Settings()
        try:
            self._settings_file.save(self._settings)
        except OSError as exc:
            log.warning("cannot save settings: %s", exc)
        self.statusBar().showMessage("All conversations deleted and settings reset.", 10_000)

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
        self._update_context(0)
        self.composer.editor.setFocus()

    @Slot(QModelIndex, QModelIndex)
    def _on_conversation_selected(self, current: QModelIndex, _previous: QModelIndex) -> None:
        cid = current.data(ConversationIdRole) if current.isValid() else None
        if cid is None or cid == self._conversation_id:
            return
        self._show_conversation(cid)

    def _show_conversation(self, conversation_id: int, upto: int | None = None) -> None:
        self._conversation_id = conversation_id
        # The streaming reply, saved so far, is shown below as it streams.
        messages = [
            m for m in self.store.messages(conversation_id) if m.id != self._reply_message_id
        ]
        if upto is not None:  # a regenerated reply replaces what followed its prompt
            ids = [m.id for m in messages]
            messages = messages[: ids.index(upto) + 1] if upto in ids else messages
        self.transcript.show_messages(messages, self.store.branches(conversation_id))
        last = next((m.stats for m in reversed(messages) if m.stats is not None), None)
        self._update_context(last.prompt_tokens + last.tokens if last else 0)
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
            if self._reply is not None:
                self._reply.cancel()
            self._reply_conversation_id = None
        self.store.delete_conversation(cid)
        self._conversation_id = None
        self.conversations.refresh()
        if self.conversations.rowCount():
            self._select_row(0)
        else:
            self.transcript.show_messages([])

    def _conversation_actions_allowed(self) -> bool:
        if self._reply_request_id is not None or self.service.busy:
            self.statusBar().showMessage("Wait for the reply to finish, or stop it.", 5_000)
            return False
        return True

    @Slot()
    def _on_rename_conversation_requested(self) -> None:
        cid = self._conversation_id
        conversation = self.store.conversation(cid) if cid is not None else None
        if conversation is None:
            return
        title, ok = QInputDialog.getText(self, "Rename Chat", "Title:", text=conversation.title)
        if ok and title.strip():
            self.store.rename_conversation(conversation.id, title.strip())
            self.conversations.refresh()
            self._select_row(self.conversations.row_of(conversation.id))

    @Slot()
    def _on_duplicate_conversation_requested(self) -> None:
        if self._conversation_id is None:
            return
        copy = self.store.duplicate_conversation(self._conversation_id)
        self.conversations.refresh()
        self._select_row(self.conversations.row_of(copy.id))

    @Slot()
    def _on_system_prompt_requested(self) -> None:
        cid = self._conversation_id
        if cid is None:
            cid = self.store.create_conversation("New chat").id
            self.conversations.refresh()
            self._select_row(self.conversations.row_of(cid))
        conversation = self.store.conversation(cid)
        assert conversation is not None
        text, ok = QInputDialog.getMultiLineText(
            self,
            "System Prompt",
            "Instructions the model follows for this whole chat:",
            conversation.system_prompt or "",
        )
        if ok:
            self.store.set_system_prompt(cid, text.strip() or None)

    @Slot()
    def _on_export_conversation_requested(self) -> None:
        cid = self._conversation_id
        conversation = self.store.conversation(cid) if cid is not None else None
        if conversation is None:
            return
        safe = "".join(c if c.isalnum() or c in " -_" else "_" for c in conversation.title)
        path, chosen = QFileDialog.getSaveFileName(
            self,
            "Export Chat",
            f"{safe.strip() or 'chat'}.md",
            "Markdown (*.md);;Tandem JSON (*.json)",
        )
        if path:
            self.export_conversations(Path(path), [conversation.id], as_json="JSON" in chosen)

    @Slot()
    def _on_export_all_requested(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Export All Chats", "Tandem chats.json", "Tandem JSON (*.json)"
        )
        if path:
            self.export_conversations(Path(path), None, as_json=True)

    def export_conversations(self, path: Path, ids: list[int] | None, as_json: bool) -> bool:
        """Writes chats to ``path`` as JSON (all branches) or Markdown (the branch shown)."""
        from app.files import write_atomic

        try:
            if as_json or ids is None or path.suffix.lower() == ".json":
                data = json.dumps(self.store.export_json(ids), indent=2, ensure_ascii=False)
            else:
                data = self.store.export_markdown(ids[0])
            write_atomic(path, data.encode("utf-8"))
        except OSError as exc:
            self.show_error(f"Could not export to {path.name}: {exc.strerror or exc}")
            return False
        self.statusBar().showMessage(f"Exported to {path.name}.", 5_000)
        return True

    @Slot()
    def _on_import_requested(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import Chats", "", "Tandem JSON (*.json)")
        if path:
            self.import_conversations(Path(path))

    def import_conversations(self, path: Path) -> list[int]:
        """Adds the chats of a Tandem JSON export; a bad file changes nothing."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            ids = self.store.import_json(data)
        except (OSError, ValueError) as exc:
            self.show_error(f"Could not import {path.name}: {first_line(exc)}")
            return []
        self.conversations.refresh()
        if ids:
            self._select_row(self.conversations.row_of(ids[0]))
        self.statusBar().showMessage(f"Imported {len(ids)} chat(s) from {path.name}.", 5_000)
        return ids

    @Slot(str)
    def _on_search_text_changed(self, _text: str) -> None:
        self._search_timer.start()  # searches once typing pauses

    @Slot()
    def _on_search_timeout(self) -> None:
        self.conversations.set_search(self.search_edit.text())

    @Slot()
    def _on_find_requested(self) -> None:
        self.search_edit.setFocus()
        self.search_edit.selectAll()

    # Messages

    @Slot(int)
    def _on_copy_requested(self, message_id: int) -> None:
        m = self.store.message(message_id)
        if m is not None:
            QApplication.clipboard().setText(m.content)
            self.statusBar().showMessage("Message copied.", 3_000)

    @Slot(int)
    def _on_edit_requested(self, message_id: int) -> None:
        m = self.store.message(message_id)
        if m is None or m.role != "user" or not self._conversation_actions_allowed():
            return
        if self._pair is None:
            self.show_error("Load a target model first: choose its folder above and press Load.")
            return
        text, ok = QInputDialog.getMultiLineText(self, "Edit Message", "Message:", m.content)
        if not ok or not text.strip() or text.strip() == m.content:
            return
        # The edit starts a branch beside the original; both stay reachable.
        self.store.add_message(m.conversation_id, "user", text.strip(), parent_id=m.parent_id)
        self._start_reply(m.conversation_id)

    @Slot(int)
    def _on_regenerate_requested(self, message_id: int) -> None:
        m = self.store.message(message_id)
        if m is None or m.role != "assistant" or not self._conversation_actions_allowed():
            return
        if self._pair is None or m.parent_id is None:
            self.show_error("Load a target model first: choose its folder above and press Load.")
            return
        self._start_reply(m.conversation_id, parent_id=m.parent_id)

    @Slot(int)
    def _on_delete_message_requested(self, message_id: int) -> None:
        m = self.store.message(message_id)
        if m is None or not self._conversation_actions_allowed():
            return
        answer = QMessageBox.question(
            self,
            "Delete Message",
            "Delete this message and everything after it in this branch?",
            QMessageBox.StandardButton.Cancel | QMessageBox.StandardButton.Yes,
            QMessageBox.StandardButton.Cancel,
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.store.delete_message(message_id)
            self._show_conversation(m.conversation_id)

    @Slot(int, int)
    def _on_branch_requested(self, message_id: int, delta: int) -> None:
        if not self._conversation_actions_allowed():
            return
        siblings = self.store.siblings(message_id)
        if message_id not in siblings:
            return
        target = siblings[(siblings.index(message_id) + delta) % len(siblings)]
        self.store.switch_branch(target)
        m = self.store.message(target)
        if m is not None:
            self._show_conversation(m.conversation_id)

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
        # The window's reply in flight stops first; its text so far is kept as usual.
        self._stop_own_work()
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
        self.panel.show_auto_k(None)  # the last pair's choice says nothing of this one
        remote = info.target.startswith(("http://", "https://"))
        self.panel.gauge.empty_text = NOT_REPORTED_TEXT if remote else EMPTY_TEXT
        self.panel.tune_button.setEnabled(not remote)  # a sweep needs a local pair
        self.live.set_lifetime(*self.store.pair_totals(info.target, info.draft))
        self.panel.gauge.set_snapshot(self.live.snapshot())
        self._update_context()
        best = self._settings.best_k.get(pair_key(info.target, info.draft))
        if best is not None:  # the calibrated k is this pair's fixed k; Auto stays as it is
            self.panel.set_fixed_k(best)
        self._save_settings(target=info.target, draft=info.draft)

    # Chat

    def params(self) -> GenerationParams:
        s = self._settings
        return GenerationParams(
            max_tokens=s.max_tokens,
            temperature=self.model_bar.temp_spin.value(),
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p,
            repetition_penalty=s.repetition_penalty,
            seed=s.seed,
            num_draft=self.panel.num_draft(),
            k_max=K_MAX,  # Auto may plan as far as the slider reaches
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
            conversation = self.store.create_conversation(
                title, system_prompt=self._pending_system_prompt
            )
            self._conversation_id = conversation.id
        cid = self._conversation_id
        self.store.add_message(cid, "user", text)
        self.composer.clear()
        self._start_reply(cid)
        self._save_settings(
            num_draft=self.panel.k_slider.value(),
            auto_draft=self.panel.auto_check.isChecked(),
            prompt_lookup=self.model_bar.lookup_check.isChecked(),
            temperature=self.model_bar.temp_spin.value(),
        )

    def history(self, cid: int, upto: int | None = None) -> list[Message]:
        """The conversation as the model sees it: its system prompt, then the branch shown.

        Args:
            cid: The conversation.
            upto: Stop after this message (to regenerate the reply that followed it).
        """
        conversation = self.store.conversation(cid)
        out = []
        if conversation is not None and conversation.system_prompt:
            out.append(Message("system", conversation.system_prompt))
        for m in self.store.messages(cid):
            out.append(Message(m.role, m.content))
            if m.id == upto:
                break
        return out

    def _start_reply(self, cid: int, parent_id: int | None = None) -> None:
        """Shows the conversation and asks the engine for the next reply.

        The engine keeps both models' caches, so only what follows the longest
        prefix it already holds is computed again, as after an edit.
        """
        conversation = self.store.conversation(cid)
        # The reply belongs after this message, whatever branch is shown when it ends.
        self._reply_parent_id = (
            parent_id
            if parent_id is not None
            else (conversation.head_id if conversation is not None else None)
        )
        self.conversations.refresh()
        self._select_row(self.conversations.row_of(cid))
        self._show_conversation(cid, upto=parent_id)
        self._reply_conversation_id = cid
        self._reply_text = []
        self._reply_segments = []
        self._reply_message_id = None
        self._reply_saved_at = time.monotonic()
        self.transcript.begin_reply()
        self.composer.set_busy(True)
        self._reply = self.service.generate(self.history(cid, parent_id), self.params())
        self._reply_request_id = self._reply.request_id

    @Slot()
    def _on_stop_requested(self) -> None:
        self._stop_own_work()

    def _stop_own_work(self) -> None:
        """Stops the window's reply and calibration; the server's replies run on."""
        if self._reply is not None:
            self._reply.cancel()
        if self._calibration is not None:
            self._calibration.cancel()

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
        auto_k = next((r.k for r in reversed(batch.rounds) if r.auto and r.k), None)
        if auto_k is not None:
            self.panel.show_auto_k(auto_k)
        if self.panel.isVisible():
            self.panel.gauge.set_snapshot(self.live.snapshot())
        if time.monotonic() - self._reply_saved_at >= REPLY_SAVE_INTERVAL:
            self._save_partial_reply()

    def _save_partial_reply(self) -> None:
        """Saves the reply streamed so far, marked as interrupted until it ends.

        The first save adds it where :meth:`_save_reply` would; later ones
        replace its text. Should the app die, it reopens with the reply so far.
        """
        self._reply_saved_at = time.monotonic()
        cid = self._reply_conversation_id
        text = "".join(self._reply_text)
        if cid is None or not text or self.store.conversation(cid) is None:
            return
        segments = _matching(tuple(self._reply_segments), text)
        try:
            if self._reply_message_id is None:
                saved = self._add_reply(
                    cid, text, self._pair, finish_reason="error", segments=segments
                )
                self._reply_message_id = saved.id
            else:
                self.store.update_message(
                    self._reply_message_id, content=text, finish_reason="error", segments=segments
                )
        except (sqlite3.Error, ValueError) as exc:  # the final save tries again
            log.warning("cannot save the reply so far: %s", exc)

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
        self._update_context(f.stats.prompt_tokens + f.stats.tokens)

    @Slot(object)
    def _on_failed(self, failure: EngineFailure) -> None:
        if failure.unloaded:  # out of memory: the engine dropped the pair
            self._pair = None
            self.pair_label.setText("No model loaded")
            self._update_context()
        if failure.stage == "load":
            self.model_bar.set_loading(False)
            self.load_progress.hide()
            self.pair_label.setText(self._pair.label if self._pair else "No model loaded")
            if self.onboarding is not None:
                self.onboarding.show_message(failure.message)
        elif failure.stage == "calibrate":
            if self._calibration is None or failure.request_id != self._calibration.request_id:
                return
            self._calibration = None
            if self.tune_dialog is not None:
                self.tune_dialog.show_error(failure.message)
            self.composer.set_busy(False)
            return
        elif failure.request_id == self._reply_request_id:
            self._save_reply(
                failure.text, "error", self._pair, None, (), tuple(self._reply_segments)
            )
        else:  # another caller's reply, such as a server request: not the window's to show
            return
        self.show_error(failure.message)

    def _add_reply(
        self, cid: int, text: str, pair: PairInfo | None, **details: Any
    ) -> StoredMessage:
        """Adds the reply after the message it answers, with the pair that wrote it."""
        branch: dict[str, Any] = (
            {} if self._reply_parent_id is None else {"parent_id": self._reply_parent_id}
        )
        return self.store.add_message(
            cid,
            "assistant",
            text,
            **branch,
            target=pair.target if pair else None,
            draft=pair.draft if pair else None,
            **details,
        )

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
        partial_id = self._reply_message_id
        self._reply_request_id = None
        self._reply = None
        self._reply_conversation_id = None
        self._reply_message_id = None
        self._reply_text = []
        self._reply_segments = []
        self.composer.set_busy(False)
        if cid is None or self.store.conversation(cid) is None:
            return
        saved = None
        segments = _matching(segments, text)
        if partial_id is not None and self.store.message(partial_id) is not None:
            # Saved while it streamed: it gets its final text and details.
            saved = self.store.update_message(
                partial_id,
                content=text,
                finish_reason=reason,
                stats=stats,
                origins=origins,
                segments=segments,
            )
        elif text or reason != "error":
            saved = self._add_reply(
                cid,
                text,
                pair,
                finish_reason=reason,
                stats=stats,
                origins=origins,
                segments=segments,
            )
        self.conversations.refresh()
        if cid == self._conversation_id:
            self._select_row(self.conversations.row_of(cid))
            note = {"cancelled": "Stopped.", "error": "Interrupted by an error."}.get(reason, "")
            if saved is not None and len(self.store.siblings(saved.id)) > 1:
                self._show_conversation(cid)  # shows the new branch's switcher
            else:
                stats_id = saved.id if saved is not None and stats is not None else None
                message_id = saved.id if saved is not None else None
                self.transcript.end_reply(note, stats_id, message_id=message_id)
        self._reply_parent_id = None

    def _update_context(self, used: int | None = None) -> None:
        """Shows how much of the target's window the conversation fills."""
        if used is not None:
            self._context_used = used
        window = self._pair.context_length if self._pair is not None else None
        if window is None:
            self.context_label.setText("")
            return
        used = self._context_used
        share = used / window
        self.context_label.setText(f"Context {used:,} / {window:,}")
        warn = share >= CONTEXT_WARNING
        self.context_label.setStyleSheet("color: #d97706;" if warn else "")
        self.context_label.setToolTip(
            f"The conversation uses {share:.0%} of the model's window; start a new chat "
            "before it fills up."
            if warn
            else f"The conversation uses {share:.0%} of the model's {window:,}-token window."
        )

    # Presets

    def _fill_presets(self) -> None:
        combo = self.model_bar.preset_combo
        combo.clear()
        combo.addItem("Custom")  # the settings as they are
        for preset in self.presets:
            combo.addItem(preset.name)

    def apply_preset(self, preset: Preset) -> None:
        """Makes a preset's sampling, draft settings and system prompt the current ones."""
        self.model_bar.temp_spin.setValue(preset.temperature)
        self.model_bar.lookup_check.setChecked(preset.prompt_lookup)
        self.panel.k_slider.setValue(preset.num_draft)
        self.panel.auto_check.setChecked(preset.auto_draft)
        self._save_settings(
            temperature=preset.temperature,
            top_p=preset.top_p,
            top_k=preset.top_k,
            min_p=preset.min_p,
            repetition_penalty=preset.repetition_penalty,
            max_tokens=preset.max_tokens,
            seed=preset.seed,
            prompt_lookup=preset.prompt_lookup,
        )
        cid = self._conversation_id
        conversation = self.store.conversation(cid) if cid is not None else None
        if conversation is not None and preset.system_prompt and not conversation.system_prompt:
            self.store.set_system_prompt(conversation.id, preset.system_prompt)
        self._pending_system_prompt = preset.system_prompt or None
        self.statusBar().showMessage(f"Preset “{preset.name}” applied.", 4_000)

    @Slot(int)
    def _on_preset_activated(self, index: int) -> None:
        if 1 <= index <= len(self.presets):
            self.apply_preset(self.presets[index - 1])

    @Slot()
    def _on_save_preset_requested(self) -> None:
        name, ok = QInputDialog.getText(self, "Save Preset", "Name:")
        if ok and name.strip():
            self.save_preset(name.strip())

    def save_preset(self, name: str) -> Preset | None:
        """Saves the current sampling and draft settings under ``name``."""
        from app.store import presets as p

        s = self._settings
        cid = self._conversation_id
        conversation = self.store.conversation(cid) if cid is not None else None
        try:
            preset = Preset(
                name=name,
                system_prompt=(conversation.system_prompt or "") if conversation else "",
                temperature=self.model_bar.temp_spin.value(),
                top_p=s.top_p,
                top_k=s.top_k,
                min_p=s.min_p,
                repetition_penalty=s.repetition_penalty,
                max_tokens=s.max_tokens,
                seed=s.seed,
                num_draft=self.panel.k_slider.value(),
                auto_draft=self.panel.auto_check.isChecked(),
                prompt_lookup=self.model_bar.lookup_check.isChecked(),
            ).validated()
            presets = p.upsert(self.presets, preset)
            self._presets_file.save(presets)
        except (ValueError, OSError) as exc:
            self.show_error(f"Could not save the preset: {first_line(exc)}")
            return None
        self.presets = presets
        self._fill_presets()
        self.model_bar.preset_combo.setCurrentText(preset.name)
        return preset

    @Slot()
    def _on_delete_preset_requested(self) -> None:
        from app.store import presets as p

        index = self.model_bar.preset_combo.currentIndex()
        if not 1 <= index <= len(self.presets):
            return
        try:
            presets = p.remove(self.presets, self.presets[index - 1].name)
            self._presets_file.save(presets)
        except (ValueError, OSError) as exc:
            self.show_error(f"Could not delete the preset: {first_line(exc)}")
            return
        self.presets = presets
        self._fill_presets()

    # Speculation panel

    @Slot(int)
    def _on_generation_started(self, request_id: int) -> None:
        if request_id == self._reply_request_id:
            self.live.begin_message()

    @Slot(object)
    def _on_draft_length_changed(self, num_draft: int | None) -> None:
        # The window's reply in flight takes it from its next round.
        if self._reply is not None:
            self._reply.set_draft_length(num_draft)
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
        dialog.cancel_requested.connect(self._on_tune_cancel_requested)
        dialog.best_k_chosen.connect(self.panel.set_num_draft)
        last = self._calibrations.get(self._pair.target, self._pair.draft)
        if last is not None:
            dialog.show_last_result(last)
        self.tune_dialog = dialog
        dialog.open()
        return dialog

    @Slot(object)
    def _on_tune_run_requested(self, prompts: list[str]) -> None:
        if self.service.busy:
            self.tune_dialog.show_error("Wait for the reply to finish, or stop it, then run.")
            return
        self.composer.set_busy(True)
        self._calibration = self.service.calibrate(prompts, TUNE_KS)

    @Slot()
    def _on_tune_cancel_requested(self) -> None:
        if self._calibration is not None:
            self._calibration.cancel()

    @Slot(object)
    def _on_calibration_progressed(self, progress: Any) -> None:
        if self.tune_dialog is not None:
            self.tune_dialog.show_progress(progress)

    @Slot(object)
    def _on_calibration_finished(self, result: Any) -> None:
        self._calibration = None
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
            try:  # shown again the next time Tune… opens for this pair
                self._calibrations.put(self._pair.target, self._pair.draft, result)
            except OSError as exc:
                log.warning("cannot save the calibration: %s", exc)

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

    def changeEvent(self, event: QEvent) -> None:
        # Light/dark switched in System Settings: code colours follow the new palette.
        # Qt sends palette events while the window is still being built.
        rid, cid = getattr(self, "_reply_request_id", 1), getattr(self, "_conversation_id", None)
        idle = rid is None and cid is not None and self.isVisible()
        if event.type() == QEvent.Type.PaletteChange and idle:
            assert self._conversation_id is not None
            self._show_conversation(self._conversation_id)
        super().changeEvent(event)

    def closeEvent(self, event: QCloseEvent) -> None:
        QSettings().setValue("window/geometry", self.saveGeometry())
        if self._reply_request_id is not None:
            self._save_partial_reply()  # the reply may not get to end before the app quits
        self._stop_own_work()
        if self._hub is not None:
            self._hub.shutdown()
        super().closeEvent(event)
