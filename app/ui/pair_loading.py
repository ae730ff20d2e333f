"""Loading a pair: the library, the first-run view, the Load button and what loading says."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Slot
from PySide6.QtWidgets import QWidget

from app.engine.loader import own_head
from app.errors import ModelError
from app.remote import is_remote_target, target_name
from app.services import (
    EngineFailure,
    HubService,
    LibraryScan,
    LibraryScanner,
    LoadProgress,
    PairInfo,
)
from app.store import pair_key
from app.ui.model_manager import ModelManagerDialog
from app.ui.onboarding import OnboardingView
from app.ui.statusbar.load_progress import load_text

if TYPE_CHECKING:
    from app.engine.live import LiveStats
    from app.hub.library import ModelInfo
    from app.services import ChatController, EngineService
    from app.store import Settings, Store
    from app.ui.model_bar import ModelBar
    from app.ui.onboarding import LibraryPrompt
    from app.ui.onboarding_flow import OnboardingFlow
    from app.ui.speculation_panel import SpeculationPanel
    from app.ui.statusbar import StatusBar
    from app.ui.tune_flow import TuneFlow

LOAD_FIRST = "Load a target model first: choose its folder above and press Load."


@dataclass(frozen=True)
class PairLoadingHost:
    """What pair loading asks of the window it serves, and what it tells it.

    Attributes:
        settings: The window's settings as they are now.
        save_settings: Saves these changes to the settings.
        show_error: Shows one line of trouble in the window.
        hide_error: Hides the line of trouble.
        stop_own_work: Stops the window's reply in flight, keeping its text so far.
        update_context: Shows how much of the loaded target's window the chat fills.
    """

    settings: Callable[[], Settings]
    save_settings: Callable[..., None]
    show_error: Callable[[str], None]
    hide_error: Callable[[], None]
    stop_own_work: Callable[[], None]
    update_context: Callable[[], None]


class PairLoading(QObject):
    """The window's model library, first run and pair loading; it owns the loaded pair."""

    def __init__(
        self,
        service: EngineService,
        store: Store,
        models_dir: Path | None,
        model_bar: ModelBar,
        status: StatusBar,
        panel: SpeculationPanel,
        chat: ChatController,
        tune: TuneFlow,
        live: LiveStats,
        onboarding_flow: OnboardingFlow,
        library_prompt: LibraryPrompt,
        host: PairLoadingHost,
        parent: QWidget,
    ) -> None:
        """Loads pairs on ``service`` for the window ``parent``, which also owns its dialogs.

        Args:
            service: The engine that loads the pair.
            store: Where the pair's lifetime figures live.
            models_dir: Tandem's models folder; the default one when ``None``.
            model_bar: The target and draft choice and its Load button.
            status: The status bar, which shows the pair and the load's progress.
            panel: The speculation panel, shown the loaded pair's figures.
            chat: The window's replies, told the loaded pair.
            tune: The draft-length calibration, told the loaded pair.
            live: The live figures, reset for each pair.
            onboarding_flow: The first-run view, closed once a pair loads.
            library_prompt: The library's pairs offered while nothing is loaded.
            host: What pair loading asks of the window.
            parent: The window: the owner of this, the Hub thread and the dialogs.
        """
        super().__init__(parent)
        self._service = service
        self._store = store
        self._models_dir = models_dir
        self._model_bar = model_bar
        self._status = status
        self._panel = panel
        self._chat = chat
        self._tune = tune
        self._live = live
        self._onboarding_flow = onboarding_flow
        self._library_prompt = library_prompt
        self._host = host
        self._window = parent
        self._hub: HubService | None = None
        self._pair: PairInfo | None = None
        # The library is scanned off the GUI thread; library() answers from the last scan.
        self._scanner = LibraryScanner(self)
        self._scanner.scanned.connect(self._on_library_scanned)
        self._first_scan = True
        model_bar.load_requested.connect(self._on_load_requested)
        model_bar.models_requested.connect(self._on_models_requested)
        onboarding_flow.pair_ready.connect(self._on_pair_chosen)
        onboarding_flow.models_requested.connect(self._on_models_requested)
        library_prompt.load_requested.connect(self._on_pair_chosen)
        library_prompt.models_requested.connect(self._on_models_requested)
        service.load_progressed.connect(self._on_load_progressed)
        service.pair_loaded.connect(self._on_pair_loaded)
        service.failed.connect(self._on_failed)

    @property
    def pair(self) -> PairInfo | None:
        """The loaded pair, or ``None`` while nothing is loaded."""
        return self._pair

    @property
    def hub(self) -> HubService:
        """The downloads and imports thread, started on first use."""
        if self._hub is None:
            self.set_hub(HubService(self._window))
        assert self._hub is not None
        return self._hub

    def set_hub(self, hub: HubService) -> None:
        """Uses ``hub`` for downloads and imports (tests pass a fake)."""
        self._hub = hub

    def shutdown(self) -> None:
        """Stops the downloads and imports thread, if it was ever started, and the scans."""
        self._scanner.stop()
        if self._hub is not None:
            self._hub.shutdown()

    def models_dir(self) -> Path:
        """Tandem's models folder: the one given, else the default one."""
        from app.hub import default_models_dir

        return self._models_dir or default_models_dir()

    def library(self) -> list[ModelInfo]:
        """The library's usable models as last scanned (none before the first scan ends).

        Asks for a fresh scan too, which updates the library prompt once it lands.
        """
        self._scanner.scan(self.models_dir())
        return self._scanned_library()

    def _scanned_library(self) -> list[ModelInfo]:
        scan = self._scanner.latest
        return list(scan.usable) if scan is not None else []

    def update_library_prompt(self) -> None:
        """Offers the library's pairs while nothing is loaded or loading, else hides them.

        Rescans the library unless a scan is on its way; the prompt follows it when it lands.
        """
        if not self._scanner.scanning:  # at startup library() has just asked for one
            self._scanner.scan(self.models_dir())
        self._show_library_prompt()

    @Slot(object)
    def _on_library_scanned(self, _scan: LibraryScan) -> None:
        first, self._first_scan = self._first_scan, False
        view = self._onboarding_flow.view
        # Before the first scan the library looked empty, so the first-run view may
        # have opened; a library with models closes it unless it is busy already.
        if (
            first
            and view is not None
            and view.models_button.isEnabled()
            and self._scanned_library()
            and self._pair is None
            and not self._model_bar.is_loading()
        ):
            self._onboarding_flow.close()
        self._show_library_prompt()

    def _show_library_prompt(self) -> None:
        idle = self._pair is None and not self._model_bar.is_loading()
        library = self._scanned_library() if idle and self._onboarding_flow.view is None else []
        if not library:
            self._library_prompt.hide()
            return
        from app.hub.catalog import load_catalog, recommend_local
        from app.hub.fit import usable_memory_bytes

        try:
            usable = usable_memory_bytes()
        except OSError:
            usable = 0
        try:
            catalog = load_catalog()
        except ModelError:
            catalog = []
        settings = self._host.settings()
        last = (settings.target or "", settings.draft or "")
        remote = is_remote_target(last[0]) if last[0] else False
        known = bool(last[0]) and (remote or Path(last[0]).expanduser().is_dir())
        self._library_prompt.show_choices(
            len(library), last if known else None, recommend_local(library, catalog, usable)
        )

    def show_onboarding(self) -> OnboardingView:
        """Shows the first-run view in place of the chat, with the pair for this machine."""
        return self._onboarding_flow.show()

    def open_model_manager(self) -> ModelManagerDialog:
        """Opens the library as a window-modal sheet."""
        dialog = ModelManagerDialog(
            self.models_dir(),
            target=self._model_bar.target(),
            draft=self._model_bar.draft(),
            parent=self._window,
            hub=self.hub,
            loaded=self._loaded_folders(),
        )
        dialog.pair_chosen.connect(self._on_pair_chosen)
        dialog.open()
        return dialog

    def _loaded_folders(self) -> tuple[str, ...]:
        """The local pair's folders, which stay in memory while another pair loads."""
        info = self._pair
        if info is None or info.target.startswith(("http://", "https://")):
            return ()
        return (info.target, info.draft) if info.draft else (info.target,)

    @Slot()
    def _on_models_requested(self) -> None:
        self.open_model_manager()

    @Slot(str, str)
    def _on_pair_chosen(self, target: str, draft: str) -> None:
        self._model_bar.set_pair(target, draft)
        self._on_load_requested(target, draft)

    @Slot(str, str)
    def _on_load_requested(self, target: str, draft: str) -> None:
        # The window's reply in flight stops first; its text so far is kept as usual.
        self._host.stop_own_work()
        self._host.hide_error()
        self._library_prompt.hide()
        self._model_bar.set_loading(True)
        self._status.pair.show_loading(f"Loading {target_name(target)}")
        self._status.load_progress.start()
        self._service.load_pair(target, draft or None)

    @Slot(object)
    def _on_load_progressed(self, p: LoadProgress) -> None:
        self._status.load_progress.show_progress(p)
        self._status.pair.show_loading(load_text(p))

    @Slot(object)
    def _on_pair_loaded(self, info: PairInfo) -> None:
        self._pair = info
        self._model_bar.set_pair(info.target, info.draft or "")  # by name, as loaded
        self._model_bar.set_loading(False)
        self._status.load_progress.finish()
        self._status.pair.show_pair(info)
        self._chat.set_pair(info)
        self._tune.set_pair(info)
        self._onboarding_flow.close()
        self._library_prompt.hide()
        self._host.hide_error()  # an earlier refusal, or "load first", is over
        self._panel.show_pair(remote=info.target.startswith(("http://", "https://")))
        self._live.reset_pair(own_head=own_head(info.draft))  # the panel and status bar hear it
        self._live.set_lifetime(*self._store.pair_totals(info.target, info.draft))
        self._host.update_context()
        best = self._host.settings().best_k.get(pair_key(info.target, info.draft))
        if best is not None:  # the calibrated k is this pair's fixed k; Auto stays as it is
            self._panel.set_fixed_k(best)
        self._host.save_settings(target=info.target, draft=info.draft)

    @Slot(object)
    def _on_failed(self, failure: EngineFailure) -> None:
        if failure.unloaded:  # out of memory: the engine dropped the pair
            self._pair = None
            self._tune.set_pair(None)
            self._status.pair.show_pair(None)
            self._host.update_context()
        if failure.stage == "load":
            self._model_bar.set_loading(False)
            self._status.load_progress.finish()
            self._status.pair.show_pair(self._pair)
            message = failure.message
            if self._pair is not None:
                # The fields show what answers, not the refused choice.
                self._model_bar.set_pair(self._pair.target, self._pair.draft or "")
                message += f" {self._pair.label} stays loaded."
            self._onboarding_flow.show_message(message)
            self._host.show_error(message)
        if failure.unloaded or failure.stage == "load":
            self.update_library_prompt()
        # A reply's failure is the controller's, a calibration's Tune's: each says its own.
