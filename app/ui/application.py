"""Starting and quitting the desktop app."""

from __future__ import annotations

import asyncio
import logging
import signal
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

import qasync
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication, QMessageBox

from app import __version__, resource_path
from app.engine.costs import ProfileStore
from app.files import folder_problem
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
    opened = _open_store(data_dir)
    if isinstance(opened, str):
        print(f"Tandem: unusable data folder: {opened}", file=sys.stderr)
        _say_unusable(opened)
        return 1
    data_dir, store = opened
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
        # The stopped reply's end (its final numbers) came from the engine thread
        # before it was joined: saved now, while the store is open.
        app.sendPostedEvents()
        store.close()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        reporter.uninstall()
        log.info("Tandem quit")
    return 0


def _open_store(data_dir: Path | None) -> tuple[Path, Store] | str:
    """The data folder and its chats, or one line saying why the folder is unusable."""
    try:
        folder = data_dir or default_data_dir()
    except OSError as exc:
        return f"{exc.filename or 'the data folder'}: {exc.strerror or exc}"
    if (problem := folder_problem(folder)) is not None:
        return problem
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return folder, Store(folder / "tandem.sqlite3")
    except (OSError, sqlite3.Error) as exc:  # read-only, full, or not writable by this user
        return f"{folder}: {getattr(exc, 'strerror', None) or exc}"


def _say_unusable(problem: str) -> None:
    """Tells the user, before any window opens, why Tandem cannot start and what to do."""
    box = QMessageBox(QMessageBox.Icon.Critical, "Tandem Cannot Open Its Data Folder", "")
    box.setText(f"Tandem keeps your chats and settings in a folder it cannot use:\n{problem}")
    box.setInformativeText(
        "Free some disk space or make the folder writable, then open Tandem again; "
        "or start it with --data-dir and a folder you can write to. Nothing was changed."
    )
    box.setStandardButtons(QMessageBox.StandardButton.Close)
    box.exec()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_app(sys.argv))
