"""Editing keys in a text field edit it; they never fire a destructive shortcut."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from app.services import EngineWorker
from app.ui.chat_list import SEARCH_PAUSE_MS
from tests.fakes import _fake_load, _load, _scripted, _send

CTRL = Qt.KeyboardModifier.ControlModifier


def test_ctrl_backspace_in_the_message_field_deletes_a_word_not_the_chat(
    qtbot: QtBot, make_window, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = make_window(EngineWorker(load=_fake_load, stream=_scripted(2)))
    _load(qtbot, window, "/models/fake")
    _send(qtbot, window, "keep this chat")
    asked: list[object] = []

    def question(*a: object) -> QMessageBox.StandardButton:
        asked.append(a)
        return QMessageBox.StandardButton.Yes

    monkeypatch.setattr(QMessageBox, "question", question)
    window.activateWindow()
    editor = window.composer.editor
    editor.setFocus()
    editor.setPlainText("hello world")
    editor.moveCursor(editor.textCursor().MoveOperation.End)
    qtbot.keyClick(editor, Qt.Key.Key_Backspace, CTRL)
    assert editor.toPlainText() == "hello "
    assert asked == [] and [c.title for c in window.store.conversations()] == ["keep this chat"]
    # The same key in the search field edits it too.
    search = window.chats.search_edit
    search.setFocus()
    search.setText("find me")
    qtbot.keyClick(search, Qt.Key.Key_Backspace, CTRL)
    assert search.text() == "find "
    assert asked == []
    search.clear()
    qtbot.wait(2 * SEARCH_PAUSE_MS)  # the search runs once typing pauses, before teardown
    # Where no text field has focus, the menu's shortcut still deletes (after asking).
    window.chats.conversation_list.setFocus()
    qtbot.keyClick(window.chats.conversation_list, Qt.Key.Key_Backspace, CTRL)
    assert len(asked) == 1 and window.store.conversations() == []
