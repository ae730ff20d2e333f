"""Loading a pair: the library, the first-run view, the Load button and what loading says."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Slot

from app.errors import ModelError
from app.remote import is_remote_target, target_name
from app.services import EngineFailure, HubService, LoadProgress, PairInfo
from app.store import pair_key
from app.ui.model_manager import ModelManagerDialog
from app.ui.onboarding import OnboardingView
from app.ui.statusbar.load_progress import load_text

if TYPE_CHECKING:
    from PySide6.QtWidgets import QLabel, QMainWindow

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

    _Window = QMainWindow
else:
    _Window = object

LOAD_FIRST = "Load a target model first: choose its folder above and press Load."


class PairLoadingMixin(_Window):
    """The main window's model library, first run and pair loading."""

    if TYPE_CHECKING:
        store: Store
        service: EngineService
        chat: ChatController
        tune: TuneFlow
        live: LiveStats
        model_bar: ModelBar
        panel: SpeculationPanel
        status: StatusBar
        onboarding_flow: OnboardingFlow
        library_prompt: LibraryPrompt
        error_banner: QLabel
        _hub: HubService | None
        _models_dir: Path | None
        _pair: PairInfo | None
        _settings: Settings

        def show_error(self, message: str) -> None: ...
        def hide_error(self) -> None: ...
        def _stop_own_work(self) -> None: ...
        def _update_context(self, used: int | None = None) -> None: ...
        def _save_settings(self, **changes: object) -> None: ...

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

    def models_dir(self) -> Path:
        from app.hub import default_models_dir

        return self._models_dir or default_models_dir()

    def _library(self) -> list[ModelInfo]:
        """The library's usable models."""
        from app.hub import scan_library

        try:
            return [m for m in scan_library(self.models_dir()) if m.usable]
        except OSError:
            return []

    def update_library_prompt(self) -> None:
        """Offers the library's pairs while nothing is loaded or loading, else hides them."""
        idle = self._pair is None and not self.model_bar.is_loading()
        library = self._library() if idle and self.onboarding_flow.view is None else []
        if not library:
            self.library_prompt.hide()
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
        last = (self._settings.target or "", self._settings.draft or "")
        remote = is_remote_target(last[0]) if last[0] else False
        known = bool(last[0]) and (remote or Path(last[0]).expanduser().is_dir())
        self.library_prompt.show_choices(
            len(library), last if known else None, recommend_local(library, catalog, usable)
        )

    def show_onboarding(self) -> OnboardingView:
        """Shows the first-run view in place of the chat, with the pair for this machine."""
        return self.onboarding_flow.show()

    @Slot()
    def open_model_manager(self) -> ModelManagerDialog:
        """Opens the library as a window-modal sheet."""
        dialog = ModelManagerDialog(
            self.models_dir(),
            target=self.model_bar.target(),
            draft=self.model_bar.draft(),
            parent=self,
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

    @Slot(str, str)
    def _on_pair_chosen(self, target: str, draft: str) -> None:
        self.model_bar.set_pair(target, draft)
        self._on_load_requested(target, draft)

    @Slot(str, str)
    def _on_load_requested(self, target: str, draft: str) -> None:
        # The window's reply in flight stops first; its text so far is kept as usual.
        self._stop_own_work()
        self.hide_error()
        self.library_prompt.hide()
        self.model_bar.set_loading(True)
        self.status.pair.show_loading(f"Loading {target_name(target)}")
        self.status.load_progress.start()
        self.service.load_pair(target, draft or None)

    @Slot(object)
    def _on_load_progressed(self, p: LoadProgress) -> None:
        self.status.load_progress.show_progress(p)
        self.status.pair.show_loading(load_text(p))

    @Slot(object)
    def _on_pair_loaded(self, info: PairInfo) -> None:
        self._pair = info
        self.model_bar.set_loading(False)
        self.status.load_progress.finish()
        self.status.pair.show_pair(info)
        self.chat.set_pair(info)
        self.tune.set_pair(info)
        self.onboarding_flow.close()
        self.library_prompt.hide()
        if self.error_banner.text() == LOAD_FIRST:  # sent while nothing was loaded
            self.hide_error()
        self.live.reset_pair()
        self.live.set_lifetime(*self.store.pair_totals(info.target, info.draft))
        remote = info.target.startswith(("http://", "https://"))
        self.panel.show_pair(self.live.snapshot(), remote)
        self._update_context()
        best = self._settings.best_k.get(pair_key(info.target, info.draft))
        if best is not None:  # the calibrated k is this pair's fixed k; Auto stays as it is
            self.panel.set_fixed_k(best)
        self._save_settings(target=info.target, draft=info.draft)

    @Slot(object)
    def _on_failed(self, failure: EngineFailure) -> None:
        if failure.unloaded:  # out of memory: the engine dropped the pair
            self._pair = None
            self.tune.set_pair(None)
            self.status.pair.show_pair(None)
            self._update_context()
        if failure.stage == "load":
            self.model_bar.set_loading(False)
            self.status.load_progress.finish()
            self.status.pair.show_pair(self._pair)
            self.onboarding_flow.show_message(failure.message)
            self.show_error(failure.message)
        if failure.unloaded or failure.stage == "load":
            self.update_library_prompt()
        # A reply's failure is the controller's, a calibration's Tune's: each says its own.
