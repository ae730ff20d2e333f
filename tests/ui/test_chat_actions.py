"""Chats and messages: search, rename, duplicate, export and import, system prompt,
edit and resend on a branch, regenerate, delete, copy, presets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication, QInputDialog, QMessageBox
from pytestqt.qtbot import QtBot

from app.services import EngineWorker
from tests.fakes import _fake_load, _load, _rounds, _send


def _recording(sent: list):  # type: ignore[no-untyped-def]
    inner = _rounds()

    def stream(pair, messages, params, cancel, control=None, decoder=None):  # type: ignore[no-untyped-def]
        sent.append([(m.role, m.content) for m in messages])
        yield from inner(pair, messages, params, cancel, control=control)

    return stream


@pytest.fixture
def chat(qtbot: QtBot, make_window):  # type: ignore[no-untyped-def]
    sent: list = []
    window = make_window(EngineWorker(load=_fake_load, stream=_recording(sent)))
    _load(qtbot, window, "/m/target", "/m/draft")
    window.sent = sent  # type: ignore[attr-defined]
    return window


def test_search_finds_chats_by_their_messages(qtbot: QtBot, chat) -> None:
    _send(qtbot, chat, "Tell me about lighthouses")
    chat.chats.new_requested.emit()
    _send(qtbot, chat, "A recipe for pancakes")
    assert chat.chats.conversations.rowCount() == 2
    chat.chats.search_edit.setText("lighthou")
    qtbot.waitUntil(lambda: chat.chats.conversations.rowCount() == 1, timeout=2_000)
    shown = chat.chats.conversations.index(0, 0).data()
    assert shown.startswith("Tell me about lighthouses\n") and "«lighthouses»" in shown
    chat.chats.search_edit.setText("")
    qtbot.waitUntil(lambda: chat.chats.conversations.rowCount() == 2, timeout=2_000)


def test_rename_and_duplicate(qtbot: QtBot, chat, monkeypatch: pytest.MonkeyPatch) -> None:
    _send(qtbot, chat, "Hello")
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("Greetings", True))
    actions = {a.text(): a for a in chat.menus.chat_actions}  # File menu and list menu
    actions["&Rename Chat…"].trigger()
    [c] = chat.store.conversations()
    assert c.title == "Greetings"
    actions["D&uplicate Chat"].trigger()
    titles = sorted(c.title for c in chat.store.conversations())
    assert titles == ["Greetings", "Greetings (copy)"]
    copy = next(c for c in chat.store.conversations() if c.title.endswith("(copy)"))
    assert chat.store.messages(copy.id)[0].content == "Hello"


def test_export_then_import_brings_the_chat_back(qtbot: QtBot, chat, tmp_path: Path) -> None:
    _send(qtbot, chat, "Hello there")
    [c] = chat.store.conversations()
    md, js = tmp_path / "chat.md", tmp_path / "all.json"
    assert chat.chat_actions.export_conversations(md, [c.id], as_json=False)
    assert md.read_text().startswith("# Hello there") and "Hello there" in md.read_text()
    assert chat.chat_actions.export_conversations(js, None, as_json=True)
    ids = chat.chat_actions.import_conversations(js)
    assert len(ids) == 1 and len(chat.store.conversations()) == 2
    assert [m.content for m in chat.store.messages(ids[0])] == [
        m.content for m in chat.store.messages(c.id)
    ]


def test_a_bad_import_says_why_and_adds_nothing(chat, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something else"}))
    assert chat.chat_actions.import_conversations(bad) == []
    assert chat.error_banner.text().startswith("Could not import bad.json:")
    assert chat.store.conversations() == []
    assert chat.chat_actions.import_conversations(tmp_path / "missing.json") == []


def test_export_to_an_unwritable_place_says_why(qtbot: QtBot, chat, tmp_path: Path) -> None:
    _send(qtbot, chat, "Hello")
    [c] = chat.store.conversations()
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert not chat.chat_actions.export_conversations(blocker / "x.md", [c.id], as_json=False)
    assert chat.error_banner.text().startswith("Could not export to x.md")


def test_the_system_prompt_leads_the_history(qtbot: QtBot, chat) -> None:
    _send(qtbot, chat, "First")
    actions = {a.text(): a for a in chat.menus.chat_actions}  # File menu and list menu
    actions["S&ystem Prompt…"].trigger()
    dialog = chat.findChild(QInputDialog)
    dialog.setTextValue("Answer in French.")
    dialog.accept()
    _send(qtbot, chat, "Second")
    assert chat.sent[-1][0] == ("system", "Answer in French.")
    assert [r for r, _ in chat.sent[-1]] == ["system", "user", "assistant", "user"]


def _no_dialog(*_args: object, **_kwargs: object) -> tuple[str, bool]:
    raise AssertionError("a message is edited in place, not in a dialog")


def _click_edit(chat, message_id: int):  # type: ignore[no-untyped-def]
    """Clicks Edit under a message; returns the in-place editor's text field."""
    from PySide6.QtCore import QUrl

    chat.transcript.anchorClicked.emit(QUrl(f"edit:{message_id}"))
    return chat.transcript.editor.field


def _ctrl_return(qtbot: QtBot, field) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtCore import Qt

    qtbot.keyClick(field, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)


def test_edit_resends_on_a_branch_and_both_stay_reachable(
    qtbot: QtBot, chat, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtWidgets import QPlainTextEdit

    _send(qtbot, chat, "Original question")
    [c] = chat.store.conversations()
    user = chat.store.messages(c.id)[0]
    monkeypatch.setattr(QInputDialog, "getMultiLineText", _no_dialog)
    field = _click_edit(chat, user.id)
    assert field.isVisible() and field.toPlainText() == "Original question"
    assert field.lineWrapMode() == QPlainTextEdit.LineWrapMode.WidgetWidth
    assert chat.transcript.editing_message == user.id
    field.setPlainText("Edited question")
    with qtbot.waitSignal(chat.service.generation_finished, timeout=10_000):
        _ctrl_return(qtbot, field)
    assert not field.isVisible() and chat.transcript.editing_message is None
    assert chat.sent[-1] == [("user", "Edited question")]
    edited = chat.store.messages(c.id)
    assert edited[0].content == "Edited question" and len(edited) == 2
    assert len(chat.store.siblings(edited[0].id)) == 2
    assert "‹ 2/2 ›" in chat.transcript.toPlainText().replace("\u2002", "")
    chat.transcript.branch_requested.emit(edited[0].id, -1)
    assert chat.store.messages(c.id)[0].content == "Original question"
    assert "‹ 1/2 ›" in chat.transcript.toPlainText().replace("\u2002", "")


def test_an_edit_cancelled_unchanged_or_emptied_changes_nothing(
    qtbot: QtBot, chat, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtCore import Qt

    _send(qtbot, chat, "Hello")
    [c] = chat.store.conversations()
    user, reply = chat.store.messages(c.id)
    shown = chat.transcript.toPlainText()
    monkeypatch.setattr(QInputDialog, "getMultiLineText", _no_dialog)
    field = _click_edit(chat, user.id)
    for text in ("Hello", "  \n ", "Hello \n"):  # unchanged, empty, unchanged once stripped
        field.setPlainText(text)
        _ctrl_return(qtbot, field)
        assert field.isVisible()  # the editor stays for another try
    chat.transcript.editor.save_button.click()
    qtbot.keyClicks(field, "Goodbye")
    qtbot.keyClick(field, Qt.Key.Key_Escape)
    assert not field.isVisible() and not chat.chat.busy
    assert [m.id for m in chat.store.messages(c.id)] == [user.id, reply.id]
    assert chat.store.siblings(user.id) == [user.id]
    assert chat.transcript.toPlainText() == shown and len(chat.sent) == 1


def test_edit_waits_while_a_reply_streams(
    qtbot: QtBot, make_window, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from tests.fakes import _reads_then_replies

    gate = threading.Event()
    window = make_window(EngineWorker(load=_fake_load, stream=_reads_then_replies(1, gate)))
    _load(qtbot, window, "/m/target", "/m/draft")
    monkeypatch.setattr(QInputDialog, "getMultiLineText", _no_dialog)
    try:
        window.composer.editor.setPlainText("Hello")
        window.composer.send_button.click()
        qtbot.waitUntil(lambda: window.chat.busy, timeout=5_000)
        [c] = window.store.conversations()
        user = window.store.messages(c.id)[0]
        field = _click_edit(window, user.id)
        assert not field.isVisible() and window.transcript.editing_message is None
        assert window.statusBar().currentMessage() == "Wait for the reply to finish, or stop it."
        with qtbot.waitSignal(window.service.generation_finished, timeout=5_000):
            gate.set()
    finally:
        gate.set()


def test_regenerate_adds_a_sibling_reply(qtbot: QtBot, chat) -> None:
    _send(qtbot, chat, "Hello")
    [c] = chat.store.conversations()
    user, reply = chat.store.messages(c.id)
    with qtbot.waitSignal(chat.service.generation_finished, timeout=10_000):
        chat.transcript.regenerate_requested.emit(reply.id)
    assert chat.sent[-1] == [("user", "Hello")]
    user2, reply2 = chat.store.messages(c.id)
    assert user2.id == user.id and reply2.id != reply.id
    assert chat.store.siblings(reply2.id) == [reply.id, reply2.id]
    assert reply2.parent_id == user.id


def test_delete_and_copy_a_message(qtbot: QtBot, chat, monkeypatch: pytest.MonkeyPatch) -> None:
    _send(qtbot, chat, "Hello")
    [c] = chat.store.conversations()
    user, reply = chat.store.messages(c.id)
    chat.transcript.copy_requested.emit(reply.id)
    assert QApplication.clipboard().text() == reply.content
    monkeypatch.setattr(QMessageBox, "question", lambda *a: QMessageBox.StandardButton.Cancel)
    chat.transcript.delete_requested.emit(reply.id)
    assert len(chat.store.messages(c.id)) == 2
    monkeypatch.setattr(QMessageBox, "question", lambda *a: QMessageBox.StandardButton.Yes)
    chat.transcript.delete_requested.emit(reply.id)
    assert [m.id for m in chat.store.messages(c.id)] == [user.id]
    thought = chat.store.add_message(
        c.id, "assistant", "<think>\nPlan.\n</think>\n\nThe answer.", parent_id=user.id
    )
    chat.transcript.copy_requested.emit(thought.id)  # a reasoning reply: its answer only
    assert QApplication.clipboard().text() == "The answer."


def test_the_chat_on_show_follows_the_store_whoever_writes_it(qtbot: QtBot, chat) -> None:
    _send(qtbot, chat, "Hello")
    [c] = chat.store.conversations()
    user, reply = chat.store.messages(c.id)
    answer = reply.content.strip()
    assert answer in chat.transcript.toPlainText()
    # A write from anywhere (another view, the server) repaints what it changed.
    other = chat.store.add_message(c.id, "assistant", "Another answer", parent_id=user.id)
    assert "Another answer" in chat.transcript.toPlainText()
    chat.store.switch_branch(reply.id)
    shown = chat.transcript.toPlainText()
    assert answer in shown and "Another answer" not in shown
    chat.store.delete_message(reply.id)
    assert "Another answer" in chat.transcript.toPlainText()
    chat.store.delete_message(other.id)
    left = chat.transcript.toPlainText()
    assert "Hello" in left and answer not in left and "Another answer" not in left
    # Another chat's writes leave this one as it is.
    painted = chat.transcript.toPlainText()
    elsewhere = chat.store.create_conversation("Elsewhere").id
    chat.store.add_message(elsewhere, "user", "Not here")
    assert chat.transcript.toPlainText() == painted


def test_presets_apply_save_and_delete(qtbot: QtBot, chat, tmp_path: Path) -> None:
    from app.store.presets import PresetsFile

    names = [
        chat.model_bar.preset_combo.itemText(i) for i in range(chat.model_bar.preset_combo.count())
    ]
    assert names[:2] == ["Custom", "Balanced"] and "Creative" in names
    creative = next(p for p in chat.presets_menu.presets if p.name == "Creative")
    chat.model_bar.preset_combo.activated.emit(names.index("Creative"))
    assert chat.model_bar.temp_spin.value() == pytest.approx(creative.temperature)
    assert chat.params().top_p == pytest.approx(creative.top_p)
    chat.panel.k_slider.setValue(6)
    saved = chat.save_preset("Mine")
    assert saved is not None and saved.drafting.k == 6
    assert [p.name for p in PresetsFile(tmp_path / "presets.json").load()][-1] == "Mine"
    chat.model_bar.preset_combo.setCurrentText("Mine")
    chat.presets_menu.delete_chosen()
    assert "Mine" not in [p.name for p in PresetsFile(tmp_path / "presets.json").load()]
    assert chat.save_preset("Balanced") is None  # a built-in name is refused, with a reason
    assert "Could not save the preset" in chat.error_banner.text()


def test_conversation_list_moves_with_the_keyboard(qtbot: QtBot, chat) -> None:
    from PySide6.QtCore import Qt

    _send(qtbot, chat, "Older chat")
    chat.chats.new_requested.emit()
    _send(qtbot, chat, "Newer chat")
    chat.chats.select_row(0)
    assert "Newer chat" in chat.transcript.toPlainText()
    qtbot.keyClick(chat.chats.conversation_list, Qt.Key.Key_Down)
    assert "Older chat" in chat.transcript.toPlainText()


def test_edit_and_regenerate_reuse_the_cache_up_to_the_edit_point(
    qtbot: QtBot, make_window, tiny, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from app.store import Settings, SettingsFile

    # Short replies: what is reused is the prompt, whatever the length of the reply.
    SettingsFile(tmp_path / "settings.json").save(Settings(max_tokens=24))
    window = make_window()
    _load(qtbot, window, str(tiny.target), str(tiny.copy))
    _send(qtbot, window, "Tell me a story about a lighthouse keeper")
    [c] = window.store.conversations()
    user, reply = window.store.messages(c.id)
    assert reply.stats is not None
    prompt = reply.stats.prompt_tokens
    # Regenerating sends the same prompt: all of it but the last token is cached.
    with qtbot.waitSignal(window.service.generation_finished, timeout=20_000):
        window.transcript.regenerate_requested.emit(reply.id)
    again = window.store.messages(c.id)[-1]
    assert again.stats is not None and again.stats.reused_tokens == prompt - 1
    # An edit keeps the cache up to where the texts part (the chat template's start).
    monkeypatch.setattr(QInputDialog, "getMultiLineText", _no_dialog)
    field = _click_edit(window, user.id)
    field.setPlainText("Tell me a poem instead")
    with qtbot.waitSignal(window.service.generation_finished, timeout=20_000):
        _ctrl_return(qtbot, field)
    edited = window.store.messages(c.id)[-1]
    assert edited.stats is not None and 0 < edited.stats.reused_tokens < prompt - 1


def test_the_chat_list_follows_the_store_and_keeps_its_selection(qtbot: QtBot, chat) -> None:
    _send(qtbot, chat, "Hello")
    rows = chat.chats.conversations.rowCount()
    selected = chat.chats.current_id()
    assert selected is not None
    # Written behind the window's back: the list reads the store again by itself.
    other = chat.store.create_conversation("Written elsewhere")
    assert chat.chats.conversations.rowCount() == rows + 1
    assert chat.chats.current_id() == selected  # the same chat, now one row down
    chat.store.rename_conversation(selected, "Renamed elsewhere")
    titles = [chat.chats.conversations.index(r, 0).data() for r in range(rows + 1)]
    assert "Renamed elsewhere" in titles and chat.chats.current_id() == selected
    chat.store.delete_conversation(other.id)
    assert chat.chats.conversations.rowCount() == rows


def test_a_preset_changes_only_what_it_says_and_the_list_follows_the_settings(
    qtbot: QtBot, chat
) -> None:
    chat._save_settings(max_tokens=48)
    _send(qtbot, chat, "Before the preset")
    [conversation] = chat.store.conversations()
    names = [
        chat.model_bar.preset_combo.itemText(i) for i in range(chat.model_bar.preset_combo.count())
    ]
    chat.model_bar.preset_combo.setCurrentIndex(names.index("Code"))
    chat.model_bar.preset_combo.activated.emit(names.index("Code"))
    # A built-in preset is a style: the reply length the user chose stays.
    assert chat.settings.max_tokens == 48
    assert "its system prompt for new chats" in chat.status.currentMessage()
    # The finished chat keeps the prompt its replies were made with (none).
    stored = chat.store.conversation(conversation.id)
    assert stored is not None and not stored.system_prompt
    assert chat.chat_view.pending_system_prompt  # new chats start with the preset's
    assert chat.model_bar.preset_combo.currentText() == "Code"
    chat.model_bar.set_lookup(False)  # the settings are no longer the preset's
    assert chat.model_bar.preset_combo.currentText() == "Custom"
