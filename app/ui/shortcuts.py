"""Keyboard shortcuts as this platform writes them, and those Qt leaves empty here."""

from __future__ import annotations

from PySide6.QtGui import QKeySequence

Key = QKeySequence | QKeySequence.StandardKey | str

# Where the platform has no Preferences key (Linux, Windows), Settings takes the Mac's.
SETTINGS_FALLBACK = "Ctrl+,"


def shortcut_text(key: Key) -> str:
    """``key`` as menus write it here: "⌘N" on a Mac, "Ctrl+N" elsewhere.

    Args:
        key: A portable sequence ("Ctrl+N" is ⌘N on a Mac) or a standard key.

    Returns:
        The text in the platform's own notation; "" for a key the platform lacks.
    """
    return QKeySequence(key).toString(QKeySequence.SequenceFormat.NativeText)


def settings_shortcut() -> QKeySequence:
    """The Settings shortcut: the platform's Preferences key, else Ctrl+,."""
    native = QKeySequence(QKeySequence.StandardKey.Preferences)
    return native if not native.isEmpty() else QKeySequence(SETTINGS_FALLBACK)
