"""What the app answers, on a scripted backend: names, line breaks, bad numbers, bugs, stops."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest

from app.engine import GenerationParams, Message
from app.engine.types import Stats
from app.remote import RemoteEngine, stream_remote
from app.server.http import RequestLog, create_app, listen
from app.server.protocol import (
    Event,
    Metrics,
    ModelsInfo,
    ReplyFinished,
    ReplyStarted,
    TextDelta,
)
from app.server.security import ServerConfig

MESSAGES = [{"role": "user", "content": "hi"}]
HUGE = "1" + "0" * 400  # an integer no float can hold


class ScriptedBackend:
    """Answers every request with ``deltas``, then ``stop``; ``error`` is raised instead."""

    def __init__(self, deltas: Sequence[str] = ("Hello",), error: Exception | None = None):
        self.deltas = deltas
        self.error = error
        self.closed = 0  # replies whose events were closed before their end

    def models(self) -> ModelsInfo:
        return ModelsInfo("tiny-target")

    def metrics(self) -> Metrics:
        return Metrics()

    async def generate(
        self, messages: Sequence[Message], params: GenerationParams
    ) -> AsyncIterator[Event]:
        if self.error is not None:
            raise self.error
        ended = False
        try:
            yield ReplyStarted()
            for i, text in enumerate(self.deltas):
                yield TextDelta(text, 1, 5 if i == 0 else None)
            ended = True
            yield ReplyFinished("stop", Stats(prompt_tokens=5, tokens=len(self.deltas)))
        finally:
            self.closed += not ended


def _serve(
    backend: ScriptedBackend,
    send: Any,
    log: list[RequestLog] | None = None,
    config: ServerConfig | None = None,
) -> Any:
    """Runs ``send(client)`` against the app on a free port; returns what it returns."""

    async def run() -> Any:
        app = create_app(
            backend, config or ServerConfig(port=0), on_request=None if log is None else log.append
        )
        listener = await listen(app, "127.0.0.1", 0)
        try:
            base = f"http://127.0.0.1:{listener.port}/v1"
            async with httpx.AsyncClient(base_url=base, timeout=10) as client:
                return await send(client)
        finally:
            await listener.close()

    return asyncio.run(run())


def _post(body: dict[str, Any] | bytes) -> Any:
    async def send(client: httpx.AsyncClient) -> httpx.Response:
        if isinstance(body, bytes):
            return await client.post("/chat/completions", content=body)
        return await client.post("/chat/completions", json=body)

    return send


def _chunks(raw: bytes) -> list[dict[str, Any]]:
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
    return [json.loads(e) for e in events if e != b"[DONE]"]


def _text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_replies_name_the_loaded_model_not_the_requests_model() -> None:
    big = "m" * 100_000
    whole = _serve(ScriptedBackend(), _post({"messages": MESSAGES, "model": big}))
    streamed = _serve(
        ScriptedBackend(), _post({"messages": MESSAGES, "model": big, "stream": True})
    )
    assert whole.status_code == 200 and whole.json()["model"] == "tiny-target"
    assert len(whole.content) < 2000
    chunks = _chunks(streamed.content)
    assert chunks and {c["model"] for c in chunks} == {"tiny-target"}
    assert len(streamed.content) < 5000


LINE_BREAKS = "a\u0085b\u2028c\u2029d"


def test_unicode_line_breaks_go_escaped_and_tandems_client_reads_them() -> None:
    backend = ScriptedBackend(deltas=(LINE_BREAKS,))
    raw = _serve(backend, _post({"messages": MESSAGES, "stream": True})).content
    assert raw.endswith(b"data: [DONE]\n\n")
    for char in "\u0085\u2028\u2029":
        assert char.encode() not in raw
    assert _text(_chunks(raw)) == LINE_BREAKS

    async def remote(client: httpx.AsyncClient) -> str:
        # Tandem's own remote client, reading a Tandem server (on its own thread: it blocks).
        engine = RemoteEngine(str(client.base_url).rstrip("/"))
        hi = [Message("user", "hi")]
        events = await asyncio.to_thread(
            lambda: list(stream_remote(engine, hi, GenerationParams(), threading.Event(), key=""))
        )
        return "".join(getattr(e, "text", "") for e in events)

    assert _serve(ScriptedBackend(deltas=(LINE_BREAKS,)), remote) == LINE_BREAKS


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "repetition_penalty"])
def test_an_integer_too_big_for_a_float_is_400_and_logged(field: str) -> None:
    body = b'{"messages": [{"role": "user", "content": "hi"}], "%s": %s}' % (
        field.encode(),
        HUGE.encode(),
    )
    log: list[RequestLog] = []
    reply = _serve(ScriptedBackend(), _post(body), log)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and "\n" not in error["message"]
    assert [(e.path, e.status) for e in log] == [("/v1/chat/completions", 400)]


def test_an_unexpected_failure_is_json_500_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    log: list[RequestLog] = []
    with caplog.at_level(logging.INFO, logger="app.server.http"):
        reply = _serve(
            ScriptedBackend(error=RuntimeError("a bug")), _post({"messages": MESSAGES}), log
        )
    assert reply.status_code == 500
    assert reply.json()["error"]["type"] == "server_error"
    assert [(e.path, e.status) for e in log] == [("/v1/chat/completions", 500)]
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and "RuntimeError" in errors[0].getMessage()
    assert errors[0].exc_info is None  # one line, no traceback


# "STOP" arrives in pieces; what follows it must never be sent.
SPLIT = ("Hel", "lo S", "T", "OP and more", " text")


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_split_across_deltas_ends_the_reply_before_it(stream: bool) -> None:
    backend = ScriptedBackend(deltas=SPLIT)
    body = {"messages": MESSAGES, "stop": ["never", "STOP"], "stream": stream}
    reply = _serve(backend, _post(body))
    assert reply.status_code == 200
    if stream:
        chunks = _chunks(reply.content)
        text = _text(chunks)
        reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert reasons[-1] == "stop" and reply.content.endswith(b"data: [DONE]\n\n")
    else:
        choice = reply.json()["choices"][0]
        text, reasons = choice["message"]["content"], [choice["finish_reason"]]
        assert reply.json()["usage"]["completion_tokens"] == 4  # the deltas so far
        assert reply.json()["usage"]["prompt_tokens"] == 5
    assert text == "Hello "
    assert reasons[-1] == "stop"
    assert backend.closed == 1  # the reply was stopped, not run to its end


def test_text_held_back_for_a_stop_string_that_never_came_is_sent() -> None:
    backend = ScriptedBackend(deltas=("Hello S", "T"))
    reply = _serve(backend, _post({"messages": MESSAGES, "stop": "STOP"}))
    assert reply.json()["choices"][0]["message"]["content"] == "Hello ST"
    assert backend.closed == 0


@pytest.mark.parametrize(
    "stop", ["", [], ["a", "b", "c", "d", "e"], [""], [1], 7, {"s": 1}, ["ok", None]]
)
def test_a_bad_stop_is_400_in_one_line(stop: object) -> None:
    reply = _serve(ScriptedBackend(), _post({"messages": MESSAGES, "stop": stop}))
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "stop" and "\n" not in error["message"]


def test_a_key_read_with_a_trailing_newline_lets_its_holder_in() -> None:
    async def send(client: httpx.AsyncClient) -> tuple[int, int]:
        right = await client.get("/models", headers={"Authorization": "Bearer sixteen-chars-key"})
        wrong = await client.get("/models", headers={"Authorization": "Bearer other"})
        return right.status_code, wrong.status_code

    config = ServerConfig(port=0, api_key="sixteen-chars-key\n")  # as $(cat keyfile) gives it
    assert _serve(ScriptedBackend(), send, config=config) == (200, 401)
