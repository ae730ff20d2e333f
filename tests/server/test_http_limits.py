"""Bounded work per connection: header timeout, connection cap, early failures, logs."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence

import pytest

from app.engine.types import GenerationParams, Message
from app.server.http import connection_log, create_app, listen
from app.server.protocol import Event, Metrics, ModelsInfo, ReplyFailed, ReplyStarted
from app.server.security import ServerConfig


class FailingBackend:
    """Takes every request, then refuses it as the engine does a too-long conversation."""

    def models(self) -> ModelsInfo:
        return ModelsInfo("tiny")

    def metrics(self) -> Metrics:
        return Metrics()

    async def generate(
        self, messages: Sequence[Message], params: GenerationParams
    ) -> AsyncIterator[Event]:
        yield ReplyStarted()
        yield ReplyFailed("too long", status=400, code="context_length_exceeded")


async def _request(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


def test_a_stream_refused_before_any_text_gets_its_status_not_200() -> None:
    async def run() -> bytes:
        listener = await listen(create_app(FailingBackend(), ServerConfig(port=0)), "127.0.0.1", 0)
        try:
            body = json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True})
            return await _request(
                listener.port,
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                b"Content-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body.encode(),
            )
        finally:
            await listener.close()

    answer = asyncio.run(run())
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert (error["code"], error["type"]) == ("context_length_exceeded", "invalid_request_error")


def test_a_connection_that_never_finishes_its_headers_is_closed() -> None:
    async def run() -> tuple[bytes, float]:
        app = create_app(FailingBackend(), ServerConfig(port=0), header_timeout=0.5)
        listener = await listen(app, "127.0.0.1", 0)
        try:
            loop = asyncio.get_running_loop()
            start = loop.time()
            answer = await _request(listener.port, b"GET /health HTTP/1.1\r\nHost: loc")
            return answer, loop.time() - start
        finally:
            await listener.close()

    answer, seconds = asyncio.run(run())
    assert answer == b""  # closed, unanswered
    assert seconds < 5


def test_connections_over_the_limit_get_503_and_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def run() -> list[bytes]:
        app = create_app(FailingBackend(), ServerConfig(port=0))
        listener = await listen(app, "127.0.0.1", 0, max_connections=3)
        idle = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(3)]
        try:
            await asyncio.sleep(0.1)
            extra = [_request(listener.port, b"GET /health HTTP/1.1\r\n\r\n") for _ in range(5)]
            return list(await asyncio.gather(*extra))
        finally:
            for _, writer in idle:
                writer.close()
            await listener.close()

    with caplog.at_level(logging.WARNING, logger=connection_log.name):
        answers = asyncio.run(run())
    assert all(a.startswith(b"HTTP/1.1 503") for a in answers), answers
    assert all(b"Too many open connections" in a for a in answers)
    refusals = [r for r in caplog.records if "refusing a connection" in r.getMessage()]
    assert len(refusals) == 1  # one line for the burst of five
