"""The window's replies beside the local server's: neither decides or drops the other's."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx
import qasync
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.engine.types import GenerationParams, Message
from app.server.security import ServerConfig
from app.services import EngineWorker
from app.ui.main_window import MainWindow
from tests.fakes import _fake_load, _load, _scripted


def test_send_while_a_server_reply_runs_waits_visibly_and_then_replies(
    qtbot: QtBot, make_window: Callable[..., MainWindow]
) -> None:
    # A batch of one: the server's reply fills it for about 2 s.
    worker = EngineWorker(load=_fake_load, stream=_scripted(200, delay=0.01), max_batch=1)
    window = make_window(worker)
    _load(qtbot, window, "/models/fake")
    with qtbot.waitSignal(window.service.tokens_generated, timeout=5_000):
        window.service.generate([Message("user", "Hi")], GenerationParams(), shared=True)
    window.composer.editor.setPlainText("Me too")
    with qtbot.waitSignal(window.chat.waiting, timeout=5_000):
        qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
    assert window.composer.editor.toPlainText() == ""  # taken, not left in the box
    [conversation] = window.store.conversations()
    assert [m.content for m in window.store.messages(conversation.id)] == ["Me too"]
    assert "Waiting for a place: the local server is running 1 reply" in (
        window.transcript.toPlainText()
    )
    qtbot.waitSignal(window.chat.ended, timeout=20_000).wait()
    [_, reply] = window.store.messages(conversation.id)
    assert reply.role == "assistant" and reply.content.startswith("t0 ")
    assert "Waiting for a place" not in window.transcript.toPlainText()


def test_a_server_request_is_decided_by_the_server_not_by_the_window(
    qtbot: QtBot, make_window: Callable[..., MainWindow]
) -> None:
    asked: list[GenerationParams] = []
    lock = threading.Lock()
    script = _scripted(3)

    def stream(pair, messages, params, cancel, control=None, decoder=None):  # type: ignore[no-untyped-def]
        with lock:
            asked.append(params)
        return script(pair, messages, params, cancel, control, decoder)

    window = make_window(EngineWorker(load=_fake_load, stream=stream))
    _load(qtbot, window, "/models/fake", "/models/draft")
    window.model_bar.set_lookup(True)
    window.model_bar.set_temperature(1.3)
    window.panel.set_num_draft(2)
    loop = qasync.QEventLoop(QApplication.instance())

    async def run() -> int:
        url = await window.server.start(ServerConfig("127.0.0.1", 0, None, ()))
        try:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                body = {"messages": [{"role": "user", "content": "Hi"}]}
                return (await client.post("/chat/completions", json=body)).status_code
        finally:
            await window.server.stop()

    with loop:
        status = loop.run_until_complete(run())
    assert status == 200
    [params] = asked
    assert params == GenerationParams()  # `tandem serve`'s defaults: greedy, Auto, no lookup


def test_a_refused_load_leaves_the_fields_on_the_loaded_pair_and_a_later_load_clears_it(
    qtbot: QtBot, make_window: Callable[..., MainWindow], tmp_path
) -> None:
    from app.errors import ModelError

    def load(target: str, draft, progress=None, loaded=None):  # type: ignore[no-untyped-def]
        if "broken" in target or target.startswith("http"):
            raise ModelError(f"Cannot load {target}: no config.json.")
        return _fake_load(target, draft)

    window = make_window(EngineWorker(load=load, stream=_scripted(3)))
    _load(qtbot, window, "/models/good", "/models/small")
    for target in ("/models/broken", "http://127.0.0.1:9"):  # a folder, a remote engine
        window.model_bar.target_edit.setText(target)
        with qtbot.waitSignal(window.service.failed, timeout=5_000):
            qtbot.mouseClick(window.model_bar.load_button, Qt.MouseButton.LeftButton)
        # The fields show what answers; the banner says what was refused and what stays.
        assert (window.model_bar.target(), window.model_bar.draft()) == (
            "/models/good",
            "/models/small",
        )
        assert window.error_banner.text().endswith("good stays loaded.")  # its label
        assert window.status.currentMessage() == window.error_banner.text()
    _load(qtbot, window, "/models/other")
    assert not window.error_banner.isVisible()
    assert window.status.currentMessage() == ""  # the old error is gone with the banner
