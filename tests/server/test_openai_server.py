"""`tandem serve` on the tiny pair, driven by the real OpenAI client and httpx."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import TinyModels
from tests.fakes import KEY, MESSAGES, Server, _free_port, _kill, _start, served_url


@pytest.fixture(scope="module")
def server(tiny: TinyModels) -> Iterator[Server]:
    port = _free_port()
    process = _start(
        [
            "--model",
            str(tiny.target),
            "--draft",
            str(tiny.noisy),
            "--port",
            str(port),
            "--api-key",
            KEY,
        ]
    )
    try:
        url = served_url(process)
        yield Server(url, port, process)
    finally:
        _kill(process)


def test_models_and_health(server: Server) -> None:
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["tiny-llama", "tiny-noisy"]
    health = httpx.get(f"http://127.0.0.1:{server.port}/health")
    assert health.status_code == 200
    assert health.json() == {
        "status": "ok",
        "requests_running": 0,
        "requests_waiting": 0,
        "batch_acceptance": None,
    }


def test_non_streaming_reply_carries_usage_and_timings(server: Server) -> None:
    reply = server.client().chat.completions.create(
        model="tiny-llama",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
        extra_body={"num_draft_tokens": 3},
    )
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 12 or reply.choices[0].finish_reason == "stop"
    details = reply.usage.completion_tokens_details
    assert details is not None
    assert details.accepted_prediction_tokens is not None
    assert details.accepted_prediction_tokens > 0  # the noisy copy drafts well
    assert details.rejected_prediction_tokens is not None
    extra = reply.model_extra or {}
    timings = extra["timings"]
    assert timings["draft_n_accepted"] == details.accepted_prediction_tokens
    assert timings["draft_n"] == (
        details.accepted_prediction_tokens + details.rejected_prediction_tokens
    )
    assert timings["predicted_n"] == reply.usage.completion_tokens


def _text(server: Server, num_draft: int | str) -> str:
    reply = server.client().chat.completions.create(
        model="tiny-llama",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=16,
        temperature=0,
        extra_body={"num_draft_tokens": num_draft},
    )
    return reply.choices[0].message.content or ""


def test_greedy_reply_is_the_same_with_and_without_the_draft(server: Server) -> None:
    plain = _text(server, 0)
    assert plain
    assert _text(server, 3) == plain
    assert _text(server, "auto") == plain


def test_streaming_follows_openai_chunks(server: Server) -> None:
    stream = server.client().chat.completions.create(
        model="tiny-llama",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = chunks[-2]
    assert finish.choices[0].finish_reason in ("stop", "length")
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens > 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1] if c.choices)
    assert text == _text(server, 0)[: len(text)] and text


def test_streaming_without_usage_has_no_usage_chunk(server: Server) -> None:
    chunks = list(
        server.client().chat.completions.create(
            model="tiny-llama",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=4,
            stream=True,
        )
    )
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.choices for c in chunks)


@pytest.mark.parametrize("num_draft", [3, 0])
def test_a_stop_string_ends_the_reply_before_it_streamed_or_not(
    server: Server, num_draft: int
) -> None:
    greedy = _text(server, 0)
    # Several tokens' worth from the middle of the greedy reply (with the draft, a round's).
    stop = greedy[6:14]
    assert len(stop) == 8, greedy
    before = greedy[: greedy.index(stop)]
    asked: dict[str, Any] = {
        "model": "tiny-llama",
        "messages": MESSAGES,
        "max_tokens": 16,
        "temperature": 0,
        "stop": [stop, "never in the reply"],
        "extra_body": {"num_draft_tokens": num_draft},
    }
    whole = server.client().chat.completions.create(**asked)
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == (before, "stop")
    chunks = list(server.client().chat.completions.create(**asked, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert (text, chunks[-1].choices[0].finish_reason) == (before, "stop")


def test_raw_stream_ends_with_done(server: Server) -> None:
    body = {"messages": MESSAGES, "max_tokens": 3, "stream": True}
    response = httpx.post(
        f"{server.url}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in response.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"


def test_wrong_key_is_refused(server: Server) -> None:
    with pytest.raises(openai.AuthenticationError):
        server.client("wrong").models.list()
    with pytest.raises(openai.AuthenticationError):
        server.client("wrong").chat.completions.create(
            model="tiny-llama",
            messages=MESSAGES,  # type: ignore[arg-type]
        )


def test_another_draft_model_is_refused(server: Server) -> None:
    with pytest.raises(openai.BadRequestError, match="not the loaded draft"):
        server.client().chat.completions.create(
            model="tiny-llama",
            messages=MESSAGES,  # type: ignore[arg-type]
            extra_body={"draft_model": "some-other-draft"},
        )
    reply = server.client().chat.completions.create(
        model="tiny-llama",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=2,
        extra_body={"draft_model": "tiny-noisy"},
    )
    assert reply.choices[0].message.content is not None


def test_foreign_host_is_refused(server: Server) -> None:
    response = httpx.get(
        f"http://127.0.0.1:{server.port}/v1/models",
        headers={"Host": "evil.example", "Authorization": f"Bearer {KEY}"},
    )
    assert response.status_code == 403
    assert "Host" in response.json()["error"]["message"]


def test_cors_allows_loopback_origins_only(server: Server) -> None:
    url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    ok = httpx.options(url, headers={**preflight, "Origin": "http://localhost:3000"})
    assert ok.status_code == 204
    assert ok.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "Authorization" in ok.headers["access-control-allow-headers"]
    evil = httpx.options(url, headers={**preflight, "Origin": "https://evil.example"})
    assert evil.status_code == 403
    assert "access-control-allow-origin" not in evil.headers


def test_sigterm_stops_cleanly(tiny: TinyModels) -> None:
    process = _start(["--model", str(tiny.target), "--port", str(_free_port())])
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "serving on" in line
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
        assert process.returncode == 0
        assert "terminate called" not in err
    finally:
        _kill(process)


def test_non_loopback_without_key_refuses_to_start() -> None:
    started = time.monotonic()
    process = _start(["--model", "/nonexistent", "--host", "0.0.0.0", "--port", "0"])
    try:
        _, err = process.communicate(timeout=30)
        assert process.returncode == 2
        assert "set an API key" in err
        assert time.monotonic() - started < 30
    finally:
        _kill(process)
