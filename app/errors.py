"""Errors the user reads, and the helpers that turn an exception into one line.

Every layer raises or shows these (engine, hub, CLI, server, window), so they
live here, below all of them, importing nothing of the app and no Qt.
``app.engine.loader`` and ``app.engine`` re-export them for older imports.
"""

from __future__ import annotations

# Longest message shown for a foreign exception; longer text is cut.
_LIMIT = 300


class ModelError(Exception):
    """A model folder that cannot be used; the message is one line for the user."""


class IncompatiblePairError(ModelError):
    """A target and a draft that cannot be used together."""


def first_line(exc: BaseException) -> str:
    """An exception as one short line for the user: its first line, cut at 300 characters."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:_LIMIT]


def one_line(exc: BaseException) -> str:
    """An exception as one short line, all of it (mlx puts each missing tensor on a line)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= _LIMIT else text[: _LIMIT - 1] + "…"
