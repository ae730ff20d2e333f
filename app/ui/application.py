"""Starting and quitting the desktop app."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import qasync
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from app import __version__, resource_path
from app.engine.costs import ProfileStore
from app.logs import setup_logging
from app.services import EngineService, EngineWorker
from app.store import SettingsFile, Store, default_data_dir
from app.ui.errors import ErrorReporter
from app.ui.main_window import MainWindow

log = logging.getLogger(__name__)


def run_app(
    argv: list[str],
    *,
    data_dir: Path | None = None,
    target: str | None = None,
    draft: str | None = None,
    on_ready: Callable[[MainWindow], None] | None = None,
) -> int:
    """Runs the window on a qasync event loop until it closes.

    Logging goes to the user log folder (see :mod:`app.logs`); an exception
    nothing catches, on any thread, is logged and shown in a dialog while the
    app keeps running. The engine thread is stopped and joined and its models
    released before this returns, so the interpreter exits cleanly.
    """
    try:
        log_file = setup_logging()
    except OSError as exc:  # a read-only log folder must not keep the app from starting
        print(f"Tandem: cannot write the log: {exc}", file=sys.stderr)
        log_file = None
    log.info("Tandem %s starting", __version__)
    app = QApplication.instance() or QApplication(argv)
    assert isinstance(app, QApplication)
    app.setApplicationName("Tandem")
    app.setOrganizationName("Tandem")
    app.setApplicationVersion(__version__)
    app.setDesktopFileName("tandem")
    icon = resource_path("icon.svg")
    if icon.is_file():
        app.setWindowIcon(QIcon(str(icon)))
    data_dir = data_dir or default_data_dir()
    store = Store(data_dir / "tandem.sqlite3")
    service = EngineService(EngineWorker(profiles=ProfileStore(data_dir / "profiles.json")))
    window = MainWindow(store, service, SettingsFile(data_dir / "settings.json"))
    reporter = ErrorReporter(log_file, window)
    reporter.install()
    loop = qasync.QEventLoop(app)
    loop.set_exception_handler(reporter.asyncio_handler)
    asyncio.set_event_loop(loop)
    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    # Ctrl+C in a terminal quits like the menu does.
    signal.signal(signal.SIGINT, lambda *_: window.close())
    try:
        window.show()
        bar = window.model_bar
        preload = target or bar.target()
        if preload:
            bar.set_pair(preload, draft if draft is not None else bar.draft())
            bar.request_load()
        if on_ready is not None:
            on_ready(window)
        with loop:
            loop.run_until_complete(closed.wait())
            loop.run_until_complete(window.server.stop())
    finally:
        service.shutdown()
        store.close()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        reporter.uninstall()
        log.info("Tandem quit")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_app(sys.argv))
