"""The server on the real engine: the memory's limit over HTTP."""

from __future__ import annotations

import json

import httpx
import pytest
import qasync
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.engine import Message, load_pair
from app.server.security import ServerConfig
from app.services import engine_service as es
from app.services.server_service import ServerService
from tests.conftest import TinyModels
from tests.fakes import _loaded

PROMPT = "Tell me about cats."


def _body(max_tokens: int, stream: bool) -> dict[str, object]:
    return {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "num_draft_tokens": 3,
        "stream": stream,
    }


def test_a_reply_the_memory_cannot_hold_beside_the_running_one_is_answered_429(
    qtbot: QtBot, make_service, tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = load_pair(tiny.target, tiny.noisy)
    need = es.reply_kv_bytes(pair, [Message("user", PROMPT)], 600, batched=True)
    monkeypatch.setattr(es, "usable_memory_bytes", lambda: need * 3 // 2)
    engine = make_service()
    server = ServerService(engine)
    _loaded(qtbot, engine, str(tiny.target), str(tiny.noisy))
    loop = qasync.QEventLoop(QApplication.instance())

    async def run() -> tuple[int, dict[str, object], str, int]:
        url = await server.start(ServerConfig("127.0.0.1", 0, None, ()))
        try:
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                async with client.stream(
                    "POST", "/chat/completions", json=_body(600, True)
                ) as running:
                    lines = running.aiter_lines()
                    while '"content"' not in await anext(lines):
                        pass
                    refused = await client.post("/chat/completions", json=_body(600, False))
                    in_progress = server.in_progress
                    rest = "".join([line async for line in lines])
                return refused.status_code, refused.json(), rest, in_progress
        finally:
            await server.stop()

    with loop:
        status, body, rest, in_progress = loop.run_until_complete(run())
    assert status == 429
    error = body["error"]
    assert isinstance(error, dict) and "memory is full" in str(error["message"])
    assert in_progress == 1  # the refused one left; the running one runs on
    assert rest.endswith("data: [DONE]") and '"error"' not in rest  # and ends whole
    last = json.loads(rest.split("data: ")[-2])
    assert last["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_servers_prompt_is_made_off_the_engine_thread_and_read_once(
    qtbot: QtBot, make_service, tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from tests.fakes import _prompt_threads

    made_on, engine_threads, stream = _prompt_threads(monkeypatch)
    engine = make_service(es.EngineWorker(stream=stream))
    server = ServerService(engine)
    _loaded(qtbot, engine, str(tiny.target), str(tiny.copy))
    loop = qasync.QEventLoop(QApplication.instance())

    async def run() -> tuple[dict[str, object], dict[str, object]]:
        url = await server.start(ServerConfig("127.0.0.1", 0, None, ()))
        try:
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                ok = await client.post("/chat/completions", json=_body(16, False))
                long = {"messages": [{"role": "user", "content": "word " * 400_000}]}
                refused = await client.post("/chat/completions", json=long)
                return ok.json(), {"status": refused.status_code, **refused.json()}
        finally:
            await server.stop()

    with loop:
        ok, refused = loop.run_until_complete(run())
    # One prompt made per request, neither on the engine thread (where others' rounds
    # would wait for it) nor on the GUI's.
    assert len(made_on) == 2 and engine_threads
    assert not set(made_on) & (engine_threads | {threading.main_thread().ident})
    assert ok["usage"]["completion_tokens"] == 16  # type: ignore[index]
    error = refused["error"]
    assert refused["status"] == 400 and isinstance(error, dict)
    assert error["code"] == "context_length_exceeded"
