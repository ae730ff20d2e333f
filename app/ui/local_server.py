"""The local server as the window shows it: its status segment, its panel, its settings."""

from __future__ import annotations

import asyncio
import logging

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QWidget

from app.server.api_key import ApiKeyStoreError, get_api_key
from app.server.security import ServerConfig, ServerConfigError
from app.services import EngineService
from app.services.server_service import ServerService
from app.store import Settings
from app.store.settings import origins
from app.ui.server_panel import ServerPanel
from app.ui.statusbar import ServerSegment

log = logging.getLogger(__name__)


class LocalServer(QObject):
    """Starts and stops Tandem's OpenAI-compatible server as the settings say.

    Attributes:
        service: The server itself (off until :meth:`apply` starts it).
        panel: Its URL, key and recent requests; made now, so it logs the
            requests served before it opens.

    Signals:
        failed: One line saying why the server did not start.
    """

    failed = Signal(str)

    def __init__(
        self,
        engine: EngineService,
        segment: ServerSegment,
        parent: QWidget,
    ) -> None:
        super().__init__(parent)
        # A request is decided by what it asks and the server's own defaults (those
        # of `tandem serve`), never by the window's sampling, k or Lookup.
        self.service = ServerService(engine, parent=self)
        self.panel = ServerPanel(parent)
        self._segment = segment
        segment.clicked.connect(self.open_panel)
        self.service.running_changed.connect(self._on_changed)
        self.service.requests_changed.connect(self._on_changed)
        self.service.request_logged.connect(self.panel.add_request)
        self.failed.connect(self.panel.show_problem)
        engine.load_changed.connect(self.panel.show_load)
        self.panel.show_load(engine.load)

    def apply(self, settings: Settings) -> asyncio.Future[None]:
        """Starts, restarts or stops the server as ``settings`` say (on the running loop)."""
        return asyncio.ensure_future(self.apply_now(settings))

    async def apply_now(self, s: Settings) -> None:
        """What :meth:`apply` runs; a start that fails is said on ``failed``."""
        if not s.server_enabled:
            await self.service.stop()
            return
        try:
            key = get_api_key()
        except ApiKeyStoreError as exc:
            log.warning("no server API key: %s", exc)
            key = None
        try:
            config = ServerConfig(s.server_host, s.server_port, key, origins(s.server_cors_origins))
            await self.service.start(config)
        except (ServerConfigError, OSError) as exc:
            self.failed.emit(f"The local server did not start: {exc}")

    @Slot()
    def open_panel(self) -> ServerPanel:
        """Shows the server's URL, key and recent requests (modeless)."""
        self.panel.set_server(self.service.url, self.service.api_key)
        self.panel.show()
        self.panel.raise_()
        self.panel.activateWindow()
        return self.panel

    @Slot()
    def _on_changed(self, *_: object) -> None:
        service = self.service
        self._segment.show_server(service.url, service.request_count, service.in_progress)
        self.panel.set_server(self.service.url, self.service.api_key)
