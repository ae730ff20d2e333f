"""Tandem's log: a rotating file in the user log folder, kept free of secrets and chats.

:func:`setup_logging` sends every record to ``tandem.log`` under
``platformdirs.user_log_dir("Tandem")`` (1 MB, three older files kept) and
warnings to stderr as well. Two rules hold for every record:

* No secret: a filter on each handler passes the message, and any traceback,
  through :func:`scrub_text`, which hides Hugging Face tokens, every secret
  given to :func:`hide_secret` (the server's API key, remote engines' keys) and
  whatever follows ``Authorization:`` or ``Bearer`` (third-party messages, such
  as aiohttp's header parse errors, quote whole headers).
* No chat text unless debug logging is on (``TANDEM_DEBUG_LOG=1`` in the
  environment): records come from INFO up, and code that logs a message's text
  wraps it in :func:`private`, which gives only its length otherwise.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import sys
import threading
import time
from pathlib import Path

import platformdirs

from app.keychain import scrub

APP_NAME = "Tandem"
LOG_NAME = "tandem.log"
MAX_BYTES = 1_000_000
BACKUP_COUNT = 3
DEBUG_ENV = "TANDEM_DEBUG_LOG"
FORMAT = "%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"

# A header's credentials as third-party messages quote them: "Authorization: …" up
# to the end of the line or quote, and any "Bearer <token>".
_AUTH_HEADER = re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*)[^\r\n'\"]+")
_BEARER = re.compile(r"(?i)(\bbearer\s+)[^\s'\",;]+")
_secrets: set[str] = set()
_secrets_lock = threading.Lock()

_handlers: list[logging.Handler] = []
_path: Path | None = None
_root_level: int | None = None  # the root logger's level before setup_logging


def default_log_dir() -> Path:
    """The user log folder (``~/Library/Logs/Tandem`` on a Mac); not created here."""
    return Path(platformdirs.user_log_dir(APP_NAME, appauthor=False))


def debug_logging() -> bool:
    """Whether debug logging is on: ``TANDEM_DEBUG_LOG=1`` in the environment."""
    return os.environ.get(DEBUG_ENV, "").strip() == "1"


# Characters of chat text a debug log record keeps: a client's megabytes never reach the log.
LOG_TEXT_MAX = 2_000


def private(text: str) -> str:
    """Chat text as a log record may hold it: its start in debug logging, else only its length."""
    if not debug_logging():
        return f"<{len(text)} characters>"
    if len(text) <= LOG_TEXT_MAX:
        return text
    return f"{text[:LOG_TEXT_MAX]}… <{len(text)} characters>"


def hide_secret(secret: str | None) -> None:
    """Keeps ``secret`` out of every log record from now on (``None`` or ``""`` is ignored).

    Also hides it as ``repr`` of its bytes shows it, since messages quote headers so.
    """
    secret = (secret or "").strip()
    if len(secret) < 4:  # a tiny "secret" would hide ordinary words
        return
    quoted = repr(secret.encode("utf-8", "surrogatepass"))[2:-1]
    with _secrets_lock:
        _secrets.update({secret, quoted})


def _hide(text: str) -> str:
    with _secrets_lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, "***")
    text = _AUTH_HEADER.sub(r"\1***", text)
    return _BEARER.sub(r"\1***", text)


def scrub_text(text: str) -> str:
    """``text`` with secrets hidden, line by line.

    Hidden are Hugging Face tokens, secrets given to :func:`hide_secret`, and
    credentials after ``Authorization:`` or ``Bearer``.

    :func:`scrub` keeps one stripped line, so each line goes through it on its
    own and keeps its indent and line break (tracebacks stay readable).
    """
    out = []
    for line in text.splitlines(keepends=True):
        body = line.strip()
        if not body:
            out.append(line)
            continue
        start = line.index(body)
        # scrub takes an exception; one that carries the line will do.
        hidden = scrub(Exception(_hide(body)), limit=len(body))
        out.append(line[:start] + hidden + line[start + len(body) :])
    return "".join(out)


class ScrubFilter(logging.Filter):
    """Hides secrets (see :func:`scrub_text`) in a record's message, traceback and stack.

    The record is changed in place: its arguments are merged into the message.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # bad arguments: the handler reports them as usual
            return True
        record.msg, record.args = scrub_text(message), None
        if record.exc_info and not record.exc_text:
            # Formatters reuse exc_text, so the traceback is written as scrubbed here.
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub_text(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub_text(record.stack_info)
        return True


class BurstFilter(logging.Filter):
    """Lets one record through per ``seconds`` on a logger, and counts the rest.

    For failures that come in floods (bad connections, refused connections): the
    log gets one line per burst, and the next line says how many were left out,
    rather than thousands of lines rotating older logs away. Tracebacks are cut
    to their exception's first line.
    """

    def __init__(self, seconds: float = 10.0) -> None:
        super().__init__()
        self.seconds = seconds
        self._next = 0.0
        self._dropped = 0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                self._dropped += 1
                return False
            self._next = now + self.seconds
            dropped, self._dropped = self._dropped, 0
        try:
            message = record.getMessage()
        except Exception:  # bad arguments: the handler reports them as usual
            return True
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            lines = str(exc).strip().splitlines()
            message += f": {type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
            record.exc_info, record.exc_text = None, None
        if dropped:
            message += f" ({dropped} more like it in the last burst, not logged)"
        record.msg, record.args = message, None
        return True


def setup_logging(directory: Path | None = None, *, debug: bool | None = None) -> Path:
    """Logs to a rotating file (and warnings to stderr); calling again replaces the setup.

    Args:
        directory: Where ``tandem.log`` goes; the user log folder when ``None``.
        debug: Log from DEBUG up, chat text included; ``TANDEM_DEBUG_LOG`` decides
            when ``None``.

    Returns:
        The log file's path.

    Raises:
        OSError: The folder or file cannot be created.
    """
    global _path, _root_level
    stop_logging()
    directory = directory or default_log_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOG_NAME
    debug = debug_logging() if debug is None else debug
    to_file = logging.handlers.RotatingFileHandler(
        path, maxBytes=MAX_BYTES, backupCount=BACKUP_COUNT, encoding="utf-8"
    )
    to_file.setLevel(logging.DEBUG if debug else logging.INFO)
    to_stderr = logging.StreamHandler(sys.stderr)
    to_stderr.setLevel(logging.WARNING)
    for handler in (to_file, to_stderr):
        handler.setFormatter(logging.Formatter(FORMAT))
        handler.addFilter(ScrubFilter())
        logging.getLogger().addHandler(handler)
        _handlers.append(handler)
    _root_level = logging.getLogger().level
    logging.getLogger().setLevel(logging.DEBUG if debug else logging.INFO)
    _path = path
    return path


def log_path() -> Path | None:
    """The file :func:`setup_logging` writes to, or ``None`` before it ran."""
    return _path


def stop_logging() -> None:
    """Removes and closes the handlers :func:`setup_logging` installed."""
    global _path, _root_level
    root = logging.getLogger()
    while _handlers:
        handler = _handlers.pop()
        root.removeHandler(handler)
        handler.close()
    if _root_level is not None:
        root.setLevel(_root_level)
    _path, _root_level = None, None
