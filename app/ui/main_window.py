"""Tandem's main window: it lays out the features and passes what each says to the others.

The reply's life is :class:`ChatController`'s, the chat list follows the store,
and the status bar, menus, presets, first run, pair loading, chat actions, the chat on show
and Tune each live in their own module; the window lays out and routes.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QEvent, QSettings, QTimer, Slot
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QApplication,
    QInputDialog,
    QLabel,
    QMainWindow,
    QSplitter,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.engine.costs import K_MAX
from app.engine.live import LiveStats
from app.engine.types import SAMPLING_FIELDS, DraftSetting, GenerationParams
from app.services import ChatController, EngineService, HubService, StoreEvents
from app.store import Settings, SettingsFile, Store, pair_key
from app.store.presets import Preset, PresetsFile
from app.ui.chat_actions import ChatActions, ChatHost
from app.ui.chat_list import ChatList
from app.ui.chat_view import ChatView, ChatViewHost
from app.ui.composer import Composer
from app.ui.editing_keys import EditingKeysFirst
from app.ui.local_server import LocalServer
from app.ui.menus import build_menus
from app.ui.model_bar import ModelBar
from app.ui.model_manager import ModelManagerDialog
from app.ui.onboarding import LibraryPrompt, OnboardingView
from app.ui.onboarding_flow import OnboardingFlow
from app.ui.pair_loading import PairLoading, PairLoadingHost
from app.ui.presets_menu import PresetsMenu, applied_fields
from app.ui.server_panel import ServerPanel
from app.ui.settings_dialog import SettingsDialog
from app.ui.speculation_panel import SpeculationPanel
from app.ui.statusbar import StatusBar
from app.ui.transcript import TranscriptView
from app.ui.tune_flow import TUNE_KS, TuneFlow

log = logging.getLogger(__name__)

PAIR_FIELDS = ("target", "draft")
SERVER_FIELDS = ("server_enabled", "server_host", "server_port", "server_cors_origins")

__all__ = ["TUNE_KS", "MainWindow"]


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
        self.setWindowTitle("Tandem")
        self.store, self.service = store, service
        self._models_dir = models_dir
        self._settings_file = settings_file
        self._init_state()
        # The window's own reply: Stop reaches it, never the server's.
        self.chat = ChatController(store, service, self)
        self._install_editing_keys()
        self.store_events = StoreEvents(store, self)
        self._build_widgets()
        self._build_layout()
        self._build_features(settings_file.path.parent)
        self._connect()
        self._restore()

    def _init_state(self) -> None:
        """What the window keeps track of: the settings and the live figures."""
        self._settings: Settings = self._settings_file.load()
        self.live = LiveStats(max_positions=K_MAX)  # every position a draft can reach

    @property
    def settings(self) -> Settings:
        """The settings as they are now: the file's, with the window's changes saved."""
        return self._settings

    def _install_editing_keys(self) -> None:
        # Ctrl+Backspace edits the focused text field; it never deletes a chat.
        self._editing_keys = EditingKeysFirst(self)
        if (app := QApplication.instance()) is not None:
            app.installEventFilter(self._editing_keys)

    def _build_widgets(self) -> None:
        self.model_bar = ModelBar(self._settings)
        self.chats = ChatList(self.store, self.store_events)
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
        self.library_prompt = LibraryPrompt()
        self.library_prompt.hide()
        self.composer = Composer()
        self.status = StatusBar()
        self.setStatusBar(self.status)
        # The live figures' model tells both views each change (napari's model and widget).
        self.live.subscribe(self.panel.show_live)
        self.live.subscribe(self.status.show_live)

    def _build_layout(self) -> None:
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 6, 6, 6)
        right_layout.addWidget(self.transcript, 1)
        right_layout.addWidget(self.library_prompt)
        right_layout.addWidget(self.error_banner)
        right_layout.addWidget(self.composer)
        splitter = QSplitter()
        splitter.addWidget(self.chats)
        splitter.addWidget(right)
        splitter.addWidget(self.panel)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([220, 640, 260])
        central = QWidget()
        central_layout = QVBoxLayout(central)
        central_layout.setContentsMargins(0, 0, 0, 0)
        central_layout.addWidget(self.model_bar)
        self.pages = QStackedWidget()  # the chat, or the first-run view in its place
        self.pages.addWidget(splitter)
        central_layout.addWidget(self.pages, 1)
        self.setCentralWidget(central)

    def _build_features(self, data: Path) -> None:
        """The features the window composes; ``data`` is where their files live."""
        self.presets_menu = PresetsMenu(
            PresetsFile(data / "presets.json"),
            self.model_bar,
            self.panel,
            lambda: self._settings,
            self,
        )
        self.tune = TuneFlow(self.service, self.store, data / "calibrations.json", self)
        self.chat_view = ChatView(
            self.store,
            self.store_events,
            self.chat,
            self.service,
            self.tune,
            self.live,
            self.chats,
            self.transcript,
            self.composer,
            self.model_bar,
            self.panel,
            self.status,
            ChatViewHost(
                settings=lambda: self._settings,
                save_settings=self._save_settings,
                show_error=self.show_error,
                hide_error=self.hide_error,
                pair=lambda: self.pair_loading.pair,  # made below, before any signal comes
            ),
            self,
        )
        self.onboarding_flow = OnboardingFlow(
            self.pages, lambda: self.hub, self.models_dir, self.service, self
        )
        self.local_server = LocalServer(self.service, self.status.server, self)
        self.server, self.server_panel = self.local_server.service, self.local_server.panel
        self.chat_actions = ChatActions(
            self.store,
            self.chat,
            self.service,
            self.transcript,
            self.chats,
            ChatHost(
                conversation_id=lambda: self.chat_view.conversation_id,
                pair_loaded=lambda: self.pair_loading.pair is not None,
                show_error=self.show_error,
                start_reply=self.chat_view.start_reply,
                show_status=self.status.showMessage,
                forget_conversation=self.chat_view.forget_conversation,
            ),
            self,
        )
        self.pair_loading = PairLoading(
            self.service,
            self.store,
            self._models_dir,
            self.model_bar,
            self.status,
            self.panel,
            self.chat,
            self.tune,
            self.live,
            self.onboarding_flow,
            self.library_prompt,
            PairLoadingHost(
                settings=lambda: self._settings,
                save_settings=self._save_settings,
                show_error=self.show_error,
                hide_error=self.hide_error,
                stop_own_work=self.chat_view.stop,
                update_context=self.chat_view.update_context,
            ),
            self,
        )
        self.model_bar.set_library(lambda: [(m.name, m.path) for m in self.pair_loading.library()])
        self.menus = build_menus(self, self._settings.show_speculation_panel)
        self.chats.add_actions(list(self.menus.chat_actions))  # the list's context menu

    def _connect(self) -> None:
        """Wires each feature's signals to what paints or acts on them.

        The composed features (the chat view, chat actions, pair loading) wire
        their own sources; what is left crosses between features.
        """
        self.presets_menu.applied.connect(self._on_preset_applied)
        self.presets_menu.failed.connect(self.show_error)
        self.panel.drafting_changed.connect(self._on_drafting_changed)
        self.panel.colour_toggled.connect(self._on_colour_toggled)
        self.panel.tune_requested.connect(self.open_tune_dialog)
        self.tune.busy_changed.connect(self.composer.set_busy)
        self.tune.best_k_found.connect(self._on_best_k_found)
        self.transcript.code_copied.connect(
            lambda _code: self.status.showMessage("Code copied.", 3_000)
        )
        self.local_server.failed.connect(self.show_error)
        self.server_panel.switch_requested.connect(self._on_server_switch_requested)

    def _restore(self) -> None:
        """Geometry, the last chat, the server if it was on, or the first-run view."""
        self.resize(1100, 720)
        geometry = QSettings().value("window/geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        if not self.chats.is_empty():
            self.chats.select_row(0)
        if self._settings.server_enabled:
            QTimer.singleShot(0, self.apply_server_settings)  # once the event loop runs
        # The library is scanned off the GUI thread: until the first scan lands it looks
        # empty, and a library with models then closes the first-run view again.
        if not self.model_bar.target() and not self.pair_loading.library():
            self.show_onboarding()
        self.pair_loading.update_library_prompt()

    def params(self) -> GenerationParams:
        """What the window's replies are asked with (see :meth:`ChatView.params`)."""
        return self.chat_view.params()

    @property
    def onboarding(self) -> OnboardingView | None:
        """The first-run view while it is shown."""
        return self.onboarding_flow.view

    # Models and the pair, which :class:`PairLoading` loads and keeps

    @property
    def hub(self) -> HubService:
        """The downloads and imports thread, started on first use."""
        return self.pair_loading.hub

    def set_hub(self, hub: HubService) -> None:
        """Uses ``hub`` for downloads and imports (tests pass a fake)."""
        self.pair_loading.set_hub(hub)

    def models_dir(self) -> Path:
        """Tandem's models folder: the one given, else the default one."""
        return self.pair_loading.models_dir()

    def show_onboarding(self) -> OnboardingView:
        """Shows the first-run view in place of the chat, with the pair for this machine."""
        return self.pair_loading.show_onboarding()

    @Slot()
    def open_model_manager(self) -> ModelManagerDialog:
        """Opens the library as a window-modal sheet."""
        return self.pair_loading.open_model_manager()

    # Settings and the local server

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
        self.model_bar.set_temperature(settings.temperature)
        self.presets_menu.follow_settings()
        # Restart on any server change: the API key may have changed too.
        if settings.server_enabled or server_before[0]:
            self.apply_server_settings()

    def apply_server_settings(self) -> asyncio.Future[None]:
        """Starts, restarts or stops the local server as the settings say."""
        return self.local_server.apply(self._settings)

    @Slot()
    def open_server_panel(self) -> ServerPanel:
        """Shows the local server's URL, key, switch and recent requests (modeless)."""
        return self.local_server.open_panel()

    @Slot(bool)
    def _on_server_switch_requested(self, on: bool) -> None:
        # The panel's switch is Settings' "Local server" box: it stays as left.
        self._save_settings(server_enabled=on)
        self.apply_server_settings()

    @Slot()
    def _on_clear_data_requested(self) -> None:
        self.chat_view.stop()
        for c in self.store.conversations():
            self.store.delete_conversation(c.id)
        self.chat_view.forget_conversation()
        self.transcript.show_messages([])
        self._settings = Settings()
        try:
            self._settings_file.save(self._settings)
        except OSError as exc:
            log.warning("cannot save settings: %s", exc)
        self.status.showMessage("All conversations deleted and settings reset.", 10_000)

    # Presets

    @Slot(object)
    def _on_preset_applied(self, preset: Preset) -> None:
        before = self._settings
        fields = applied_fields(preset)
        self._save_settings(
            **{f: getattr(preset, f) for f in fields}, prompt_lookup=preset.prompt_lookup
        )
        self.chat_view.use_system_prompt(preset.system_prompt)
        # Say what changed beyond what the bar shows, so nothing changes unseen.
        changed = [
            f"{f.replace('_', ' ')} {getattr(before, f)} → {getattr(preset, f)}"
            for f in fields
            if f != "temperature" and getattr(before, f) != getattr(preset, f)
        ]
        if preset.system_prompt:
            changed.append("its system prompt for new chats")
        detail = f": {', '.join(changed)}" if changed else ""
        self.status.showMessage(f"Preset “{preset.name}” applied{detail}.", 8_000)

    @Slot()
    def _on_save_preset_requested(self) -> None:
        name, ok = QInputDialog.getText(self, "Save Preset", "Name:")
        if ok and name.strip():
            self.save_preset(name.strip())

    def save_preset(self, name: str) -> Preset | None:
        """Saves the current sampling and draft settings under ``name``."""
        cid = self.chat_view.conversation_id
        conversation = self.store.conversation(cid) if cid is not None else None
        prompt = (conversation.system_prompt or "") if conversation else ""
        return self.presets_menu.save_current(name, self.params(), prompt)

    # Speculation panel and Tune

    @Slot(object)
    def _on_drafting_changed(self, setting: DraftSetting) -> None:
        self.chat.set_drafting(setting)  # the reply in flight, from its next round
        self._save_settings(drafting=setting)

    @Slot(bool)
    def _on_colour_toggled(self, on: bool) -> None:
        self.transcript.colour = on
        self._save_settings(colour_tokens=on)
        self.chat_view.repaint()

    @Slot(bool)
    def _on_panel_toggled(self, on: bool) -> None:
        self.panel.setVisible(on)
        if on:
            self.panel.show_snapshot(self.live.snapshot())
        self._save_settings(show_speculation_panel=on)

    @Slot()
    def open_tune_dialog(self) -> Any:
        """Opens the draft-length calibration for the loaded pair."""
        pair = self.pair_loading.pair
        if pair is None:
            self.show_error("Load a model pair first, then tune its draft length.")
            return None
        if pair.draft is None and not self.model_bar.uses_lookup():
            self.show_error("Tuning needs a draft model: load a pair with a draft.")
            return None
        dialog = self.tune.open(self, self.panel.drafting().k, self.live.snapshot().baseline_tps)
        dialog.best_k_chosen.connect(self.panel.set_num_draft)
        return dialog

    @Slot(int)
    def _on_best_k_found(self, k: int) -> None:
        pair = self.pair_loading.pair
        if pair is not None:
            best = dict(self._settings.best_k)
            best[pair_key(pair.target, pair.draft)] = k
            self._save_settings(best_k=best)

    # Errors

    def show_error(self, message: str) -> None:
        self.error_banner.setText(message)
        self.error_banner.show()
        self.status.showMessage(message, 10_000)

    def hide_error(self) -> None:
        # The status bar's copy of the line goes with it, so a fixed problem is not shown on.
        if self.status.currentMessage() == self.error_banner.text():
            self.status.clearMessage()
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
        chat_view: ChatView | None = getattr(self, "chat_view", None)
        if event.type() == QEvent.Type.PaletteChange and chat_view is not None and self.isVisible():
            chat_view.repaint()
        super().changeEvent(event)

    def closeEvent(self, event: QCloseEvent) -> None:
        QSettings().setValue("window/geometry", self.saveGeometry())
        if self.chat.busy:
            # The user stopped it by quitting; it may not get to end before the app quits.
            self.chat.save_partial("cancelled")
        self.chat_view.stop()
        self.pair_loading.shutdown()
        super().closeEvent(event)
