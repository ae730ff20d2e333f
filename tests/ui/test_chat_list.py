"""The chat list's search: a hit opens its own branch, scrolled to and marked."""

from __future__ import annotations

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.store import Store
from tests.ui.chats import branched


def test_a_search_hit_on_another_branch_opens_that_branch_at_the_hit(
    qtbot: QtBot, make_window
) -> None:
    window = make_window()
    cid, hit = branched(window.store)
    window.chats.search_edit.setText("zebra")
    index = window.chats.conversations.index(0, 0)
    qtbot.waitUntil(lambda: "«zebra»" in str(index.data()), timeout=2_000)  # the hit is listed
    view = window.chats.conversation_list
    qtbot.mouseClick(
        view.viewport(), Qt.MouseButton.LeftButton, pos=view.visualRect(index).center()
    )
    assert hit in {m.id for m in window.store.messages(cid)}  # branch 2 is shown now
    assert "A zebra, striped." in window.transcript.toPlainText()
    assert "A horse." not in window.transcript.toPlainText()
    assert window.transcript.highlighted_message == hit
    [mark] = window.transcript.extraSelections()
    assert "zebra" in mark.cursor.selectedText()
    # The hit is in view, not left below the fold at the end of a long chat.
    shown = window.transcript.cursorRect(mark.cursor)
    assert window.transcript.viewport().rect().intersects(shown)


def test_the_empty_list_says_how_to_start_and_a_fruitless_search_says_so(
    qtbot: QtBot, tmp_path
) -> None:
    from PySide6.QtGui import QKeySequence

    from app.services import StoreEvents
    from app.ui.chat_list import ChatList

    store = Store(tmp_path / "chats.sqlite3")
    chats = ChatList(store, StoreEvents(store))
    qtbot.addWidget(chats)
    chats.show()
    new = QKeySequence(QKeySequence.StandardKey.New).toString(
        QKeySequence.SequenceFormat.NativeText
    )
    assert chats.conversation_list.empty_hint() == f"No conversations yet — press {new}"
    store.create_conversation("Animals")
    qtbot.waitUntil(lambda: not chats.is_empty(), timeout=1_000)
    assert chats.conversation_list.empty_hint() == ""  # a listed chat needs no hint
    chats.search_edit.setText("  xyz ")
    qtbot.waitUntil(chats.is_empty, timeout=1_000)
    assert chats.conversation_list.empty_hint() == "No chats match “xyz”"
    store.close()
