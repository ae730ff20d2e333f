"""Unhandled exceptions: logged with a traceback, shown in one dialog, and survived."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot
from PySide6.QtWidgets import QApplication, QMessageBox, QWidget
from pytestqt.qtbot import QtBot

from app import logs
from app.ui.errors import ErrorReporter

TOKEN = "hf_DialogTestToken0123456789abcdef"


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Path]:
    path = logs.setup_logging(tmp_path / "logs", debug=False)
    yield path
    logs.stop_logging()


@pytest.fixture
def reporter(qtbot: QtBot, log_file: Path) -> Iterator[ErrorReporter]:
    window = QWidget()
    qtbot.addWidget(window)
    window.show()
    reporter = ErrorReporter(log_file, window)
    reporter.install()
    yield reporter
    reporter.uninstall()
    if reporter.dialog is not None:
        reporter.dialog.close()


def _logged(path: Path) -> str:
    for handler in logging.getLogger().handlers:
        handler.flush()
    return path.read_text(encoding="utf-8")


def _dialog(qtbot: QtBot, reporter: ErrorReporter) -> QMessageBox:
    qtbot.waitUntil(lambda: reporter.dialog is not None and reporter.dialog.isVisible())
    assert reporter.dialog is not None
    return reporter.dialog


def test_an_exception_in_a_slot_is_logged_and_shown(
    qtbot: QtBot, reporter: ErrorReporter, log_file: Path
) -> None:
    def broken() -> None:
        raise ValueError("slot went wrong")

    QTimer.singleShot(0, broken)
    dialog = _dialog(qtbot, reporter)
    assert dialog.parent() is reporter.window
    assert "ValueError: slot went wrong" in dialog.informativeText()
    assert str(log_file) in dialog.informativeText()
    assert "keeps running" in dialog.text()
    text = _logged(log_file)
    assert "unhandled exception on MainThread" in text
    assert "Traceback (most recent call last):" in text and "in broken" in text
    # The event loop goes on.
    ran: list[bool] = []
    QTimer.singleShot(0, lambda: ran.append(True))
    qtbot.waitUntil(lambda: bool(ran))


def test_the_dialog_is_queued_not_opened_inside_the_failing_code(
    qtbot: QtBot, reporter: ErrorReporter
) -> None:
    try:
        raise RuntimeError("direct")
    except RuntimeError as exc:
        reporter.excepthook(type(exc), exc, exc.__traceback__)
    assert reporter.dialog is None  # not yet: the failing code has returned first
    assert "RuntimeError: direct" in _dialog(qtbot, reporter).informativeText()


class _Worker(QObject):
    go = Signal()

    @Slot()
    def fail(self) -> None:
        raise KeyError("worker went wrong")


def test_an_exception_on_a_qthread_is_shown_on_the_gui_thread(
    qtbot: QtBot, reporter: ErrorReporter, log_file: Path
) -> None:
    thread = QThread()
    thread.setObjectName("test-worker")
    worker = _Worker()
    worker.moveToThread(thread)
    worker.go.connect(worker.fail)
    thread.start()
    try:
        worker.go.emit()
        dialog = _dialog(qtbot, reporter)
    finally:
        thread.quit()
        thread.wait()
    assert dialog.thread() is QApplication.instance().thread()  # type: ignore[union-attr]
    assert "KeyError: 'worker went wrong'" in dialog.informativeText()
    assert "in fail" in _logged(log_file)


def test_an_exception_in_a_python_thread_is_logged_and_shown(
    qtbot: QtBot, reporter: ErrorReporter, log_file: Path
) -> None:
    def run() -> None:
        raise OSError("thread went wrong")

    thread = threading.Thread(target=run, name="test-thread")
    thread.start()
    thread.join()
    assert "OSError: thread went wrong" in _dialog(qtbot, reporter).informativeText()
    assert "unhandled exception on test-thread" in _logged(log_file)


def test_a_thread_that_exits_is_no_error(qtbot: QtBot, reporter: ErrorReporter) -> None:
    def run() -> None:
        raise SystemExit(0)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    qtbot.wait(50)
    assert reporter.count == 0 and reporter.dialog is None


def test_one_dialog_at_a_time_every_error_logged(
    qtbot: QtBot, reporter: ErrorReporter, log_file: Path
) -> None:
    for n in range(3):
        try:
            raise RuntimeError(f"error {n}")
        except RuntimeError as exc:
            reporter.excepthook(type(exc), exc, exc.__traceback__)
    first = _dialog(qtbot, reporter)
    qtbot.wait(50)
    dialogs = [w for w in QApplication.topLevelWidgets() if isinstance(w, QMessageBox)]
    dialogs += reporter.window.findChildren(QMessageBox) if reporter.window else []
    assert set(dialogs) == {first}
    assert "error 0" in first.informativeText()
    assert all(f"RuntimeError: error {n}" in _logged(log_file) for n in range(3))
    # Once it is closed, the next error gets a dialog again.
    first.close()
    qtbot.waitUntil(lambda: reporter.dialog is None)
    try:
        raise RuntimeError("later")
    except RuntimeError as exc:
        reporter.excepthook(type(exc), exc, exc.__traceback__)
    assert "later" in _dialog(qtbot, reporter).informativeText()


def test_the_dialog_and_the_log_hide_a_token(
    qtbot: QtBot, reporter: ErrorReporter, log_file: Path
) -> None:
    try:
        raise RuntimeError(f"401 for {TOKEN}")
    except RuntimeError as exc:
        reporter.excepthook(type(exc), exc, exc.__traceback__)
    assert _dialog(qtbot, reporter).informativeText().startswith("RuntimeError: 401 for hf_***")
    assert TOKEN not in _logged(log_file) and "401 for hf_***" in _logged(log_file)


def test_asyncio_errors_are_reported_too(qtbot: QtBot, reporter: ErrorReporter) -> None:
    loop = asyncio.new_event_loop()
    try:
        loop.set_exception_handler(reporter.asyncio_handler)
        loop.call_soon(lambda: 1 / 0)
        loop.call_soon(loop.stop)
        loop.run_forever()
    finally:
        loop.close()
    assert "ZeroDivisionError" in _dialog(qtbot, reporter).informativeText()


def test_uninstall_puts_the_hooks_back(qtbot: QtBot, log_file: Path) -> None:
    import sys

    before = (sys.excepthook, threading.excepthook)
    reporter = ErrorReporter(log_file)
    reporter.install()
    assert (sys.excepthook, threading.excepthook) == (
        reporter.excepthook,
        reporter.thread_excepthook,
    )
    reporter.uninstall()
    assert (sys.excepthook, threading.excepthook) == before
