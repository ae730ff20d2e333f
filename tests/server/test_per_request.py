"""Per-request replies on the real `tandem serve`: one client never stops another's reply."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import TinyModels
from tests.fakes import MESSAGES, _free_port, _kill, served_url

# Seeded sampling with a fixed k gives the same long reply every time (it runs on
# past 600 tokens on the tiny pair, so it ends at the limit): long enough for another
# client to come and go.
LONG = {
    "messages": MESSAGES,
    "max_tokens": 600,
    "temperature": 1,
    "seed": 7,
    "num_draft_tokens": 3,
    "stream": True,
    "stream_options": {"include_usage": True},
}
SHORT = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0}


@dataclass
class Served:
    url: str  # ends in /v1
    log: Path  # the server's tandem.log
    start: int = 0  # where this test's lines in the log begin

    def log_text(self) -> str:
        """The request log since this test began."""
        return self.log.read_bytes()[self.start :].decode()


@dataclass
class Streamed:
    """What a streaming client received."""

    text: str = ""
    finish_reason: str | None = None
    tokens: int | None = None
    first_text: threading.Event = field(default_factory=threading.Event)
    ended_at: float = 0.0


@pytest.fixture(scope="module")
def server(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    # Its own log folder, so these tests read only this server's request log.
    tmp_path = tmp_path_factory.mktemp("served")
    env = {**os.environ, "TANDEM_DEBUG_LOG": "0", "XDG_STATE_HOME": str(tmp_path / "state")}
    port = _free_port()
    # One request at a time, so that a second client waits its turn (tests/server/
    # test_concurrent.py covers requests that run side by side).
    args = ["--model", str(tiny.target), "--draft", str(tiny.noisy), "--port", str(port)]
    args += ["--parallel", "1"]
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        url = served_url(process)
        [log] = (tmp_path / "state").rglob("tandem.log")
        yield Served(url, log)
    finally:
        _kill(process)


@pytest.fixture
def served(server: Served) -> Served:
    """The module's server; a test reads the request log from where it began."""
    return Served(server.url, server.log, server.log.stat().st_size)


def _stream(url: str, body: dict[str, object], out: Streamed) -> Streamed:
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line.removeprefix("data: "))
            for choice in chunk["choices"]:
                out.text += choice["delta"].get("content") or ""
                out.finish_reason = choice["finish_reason"] or out.finish_reason
            if out.text:
                out.first_text.set()
            if chunk.get("usage"):
                out.tokens = chunk["usage"]["completion_tokens"]
    out.ended_at = time.monotonic()
    return out


def _reply(url: str, body: dict[str, object], timeout: float = 120) -> str:
    response = httpx.post(f"{url}/chat/completions", json=body, timeout=timeout)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


@pytest.mark.slow
def test_a_client_that_gives_up_waiting_leaves_the_running_reply_whole(served: Served) -> None:
    alone = _stream(served.url, LONG, Streamed())
    short_alone = _reply(served.url, SHORT)
    assert alone.tokens is not None and alone.tokens > 500, alone

    a = Streamed()
    streaming = threading.Thread(target=_stream, args=(served.url, LONG, a))
    streaming.start()
    assert a.first_text.wait(60)
    # B waits its turn behind A and gives up; C waits on and is answered after A.
    with pytest.raises(httpx.TimeoutException):
        _reply(served.url, SHORT, timeout=0.2)
    gave_up = time.monotonic()
    c: list[str] = []
    waiting = threading.Thread(target=lambda: c.append(_reply(served.url, SHORT)))
    waiting.start()
    streaming.join(120)
    waiting.join(120)

    assert a.ended_at > gave_up, "A ended before B gave up: the race was not run"
    # A's reply is the one it gets alone: not cut short by B leaving.
    assert (a.text, a.tokens, a.finish_reason) == (alone.text, alone.tokens, alone.finish_reason)
    assert c == [short_alone]
    # B is in the request log, as a client that left before its answer.
    log = served.log_text()
    assert "POST /v1/chat/completions 499" in log
    assert log.count("POST /v1/chat/completions 200") == 4  # alone, short alone, A, C


@pytest.mark.slow
def test_a_client_that_leaves_mid_reply_stops_only_its_own(served: Served) -> None:
    short_alone = _reply(served.url, SHORT)
    began = time.monotonic()
    alone = _stream(served.url, LONG, Streamed())
    whole = alone.ended_at - began
    with httpx.stream("POST", f"{served.url}/chat/completions", json=LONG, timeout=60) as r:
        assert r.status_code == 200
        next(line for line in r.iter_lines() if '"content"' in line)
    # Gone mid-reply: its reply stops, and the next client is answered well before
    # the long reply could have ended; a long reply after it is whole again.
    left = time.monotonic()
    assert _reply(served.url, SHORT, timeout=30) == short_alone
    assert time.monotonic() - left < whole / 2
    again = _stream(served.url, LONG, Streamed())
    assert (again.text, again.tokens) == (alone.text, alone.tokens)
