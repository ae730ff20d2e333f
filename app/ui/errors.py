"""Unhandled exceptions: logged with their traceback, shown in a dialog, and survived.

PySide hands an exception that escapes a slot or a Qt override to
``sys.excepthook`` on whatever thread raised it; Python threads use
``threading.excepthook`` and asyncio callbacks the loop's exception handler.
:class:`ErrorReporter` takes all three, logs the error and shows it on the GUI
thread, so a bug costs the user one dialog rather than the app.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtWidgets import QMessageBox, QWidget

from app.keychain import scrub

log = logging.getLogger(__name__)

ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], Any]


class ErrorReporter(QObject):
    """Logs unhandled exceptions from any thread and shows them in one dialog at a time.

    Create it on the GUI thread: the dialog is always shown there, queued, so
    it never opens inside the slot that failed.
    """

    _raised = Signal(str)  # one line about the error

    def __init__(
        self,
        log_path: Path | None = None,
        window: QWidget | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.log_path = log_path
        self.window = window  # the dialog's parent, when there is one
        self.dialog: QMessageBox | None = None
        self.count = 0  # errors reported so far
        self._previous: tuple[ExceptHook, Any] | None = None
        self._raised.connect(self._show, Qt.ConnectionType.QueuedConnection)

    def install(self) -> None:
        """Becomes ``sys.excepthook`` and ``threading.excepthook`` until :meth:`uninstall`."""
        if self._previous is None:
            self._previous = (sys.excepthook, threading.excepthook)
        sys.excepthook = self.excepthook
        threading.excepthook = self.thread_excepthook

    def uninstall(self) -> None:
        """Puts back the hooks that were there before :meth:`install`."""
        if self._previous is not None:
            sys.excepthook, threading.excepthook = self._previous
            self._previous = None

    def excepthook(
        self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        """Logs an exception that nothing caught and queues the dialog; any thread."""
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, exc, tb)
            return
        where = threading.current_thread().name
        self.report(exc, where, (kind, exc, tb))

    def thread_excepthook(self, args: threading.ExceptHookArgs) -> None:
        """``threading.excepthook``: as :meth:`excepthook`, naming the Python thread."""
        if args.exc_type is SystemExit or args.exc_value is None:
            return  # a thread's normal way out, as the default hook treats it
        where = args.thread.name if args.thread is not None else "a thread"
        self.report(args.exc_value, where, (args.exc_type, args.exc_value, args.exc_traceback))

    def asyncio_handler(self, loop: Any, context: dict[str, Any]) -> None:
        """An asyncio loop's exception handler; errors without an exception go to the default."""
        exc = context.get("exception")
        if isinstance(exc, BaseException):
            self.report(exc, "the event loop", (type(exc), exc, exc.__traceback__))
        else:
            loop.default_exception_handler(context)

    def report(self, exc: BaseException, where: str, exc_info: Any = None) -> None:
        """Logs ``exc`` with its traceback and shows the dialog on the GUI thread."""
        self.count += 1
        log.error("unhandled exception on %s", where, exc_info=exc_info or exc)
        name, text = type(exc).__name__, scrub(exc)
        self._raised.emit(text if text == name else f"{name}: {text}")

    @Slot(str)
    def _show(self, summary: str) -> None:
        if self.dialog is not None and self.dialog.isVisible():
            return  # one dialog at a time; the log has every error
        where = f"Details are in the log:\n{self.log_path}" if self.log_path else ""
        box = QMessageBox(
            QMessageBox.Icon.Critical,
            "Something Went Wrong",
            "Tandem hit an unexpected error. It keeps running; if something looks wrong, "
            "save your work and restart it.",
            QMessageBox.StandardButton.Ok,
            self.window,
        )
        box.setInformativeText(f"{summary}\n\n{where}".strip())
        box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.destroyed.connect(self._on_dialog_destroyed)
        self.dialog = box
        box.open()  # never exec(): no nested event loop inside an error

    @Slot()
    def _on_dialog_destroyed(self) -> None:
        self.dialog = None
