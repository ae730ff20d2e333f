"""stream_remote against a real mlx_lm.server on a tiny model, and scripted failures."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler

import pytest

from app.engine import Chunk, Finished, GenerationParams, Message, Origin
from app.engine.types import DraftSetting
from app.errors import ModelError
from app.remote import REMOTE_TOKEN, RemoteEngine, check_remote, stream_remote
from app.remote.client import sse_lines
from tests.conftest import TinyModels
from tests.remote.servers import free_port, reply, stub_server

HELLO = [Message("user", "Hello")]


def _collect(engine: RemoteEngine, params: GenerationParams, cancel=None, stop_after=None):
    cancel = cancel or threading.Event()
    chunks: list[Chunk] = []
    finished: list[Finished] = []
    for event in stream_remote(engine, HELLO, params, cancel, key=None, timeout=30):
        if isinstance(event, Chunk):
            chunks.append(event)
            if stop_after is not None and len(chunks) >= stop_after:
                cancel.set()
        else:
            finished.append(event)
    assert len(finished) == 1
    return chunks, finished[0]


def test_streams_a_reply_with_usage_and_no_made_up_drafts(mlx_url: str) -> None:
    engine = RemoteEngine(mlx_url + "/v1/", "mlx-lm")
    check_remote(engine)
    chunks, done = _collect(engine, GenerationParams(max_tokens=12, drafting=DraftSetting.of(0)))
    assert chunks and all(c.token_ids == (REMOTE_TOKEN,) for c in chunks)
    assert all(c.origins == (Origin.TARGET,) and c.pieces == (c.text,) for c in chunks)
    assert done.finish_reason == "length"
    assert done.stats.tokens == 12  # from the server's usage, not the delta count
    assert done.stats.prompt_tokens > 0
    assert done.stats.stats_scope == "not reported"
    assert (done.stats.drafted, done.stats.accepted) == (0, 0)
    assert len(done.token_ids) == len(chunks)


def test_streams_with_a_draft_per_request(mlx_url: str, tiny: TinyModels) -> None:
    plain = RemoteEngine(mlx_url, "mlx-lm")
    drafted = RemoteEngine(mlx_url, "mlx-lm", draft_model=str(tiny.copy))
    params = GenerationParams(max_tokens=10, drafting=DraftSetting.of(3))
    plain_chunks, _ = _collect(plain, params)
    chunks, done = _collect(drafted, params)
    # Greedy decoding with a draft is lossless: the same text, and mlx-lm reports no acceptance.
    assert "".join(c.text for c in chunks) == "".join(c.text for c in plain_chunks)
    assert done.stats.tokens == 10
    assert done.stats.stats_scope == "not reported"


def test_stop_ends_the_stream_mid_reply(mlx_url: str) -> None:
    engine = RemoteEngine(mlx_url, "mlx-lm")
    chunks, done = _collect(
        engine, GenerationParams(max_tokens=2000, drafting=DraftSetting.of(0)), stop_after=3
    )
    assert done.finish_reason == "cancelled"
    assert len(chunks) == 3
    assert done.stats.tokens == 3
    # The server is still there for the next reply.
    again, finished = _collect(engine, GenerationParams(max_tokens=4, drafting=DraftSetting.of(0)))
    assert again and finished.finish_reason == "length"


def test_dead_server_is_refused_in_one_line() -> None:
    engine = RemoteEngine(f"http://127.0.0.1:{free_port()}", "vllm")
    with pytest.raises(
        ModelError, match=r"^cannot reach http://127\.0\.0\.1:\d+: connection refused$"
    ):
        check_remote(engine)
    with pytest.raises(ModelError, match="connection refused"):
        list(stream_remote(engine, HELLO, GenerationParams(), threading.Event(), key=""))


def test_wrong_address_is_not_found(mlx_url: str) -> None:
    engine = RemoteEngine(mlx_url + "/nope", "mlx-lm")
    with pytest.raises(ModelError, match=r"/nope/v1/chat/completions was not found \(HTTP 404\)"):
        list(stream_remote(engine, HELLO, GenerationParams(max_tokens=2), threading.Event()))


def test_refused_key() -> None:
    body = b'{"error": {"message": "invalid api key"}}'
    with stub_server(reply(401, "application/json", body)) as url:
        engine = RemoteEngine(url, "llama-server")
        with pytest.raises(ModelError, match=r"^the server refused the key \(HTTP 401\)$"):
            list(stream_remote(engine, HELLO, GenerationParams(), threading.Event(), key="k"))


def test_not_an_event_stream() -> None:
    with stub_server(reply(200, "text/html", b"<html>router login</html>")) as url:
        engine = RemoteEngine(url)
        with pytest.raises(
            ModelError, match=r"did not answer with an event stream \(got text/html\)"
        ):
            list(stream_remote(engine, HELLO, GenerationParams(), threading.Event(), key=""))


def test_garbled_event_stream() -> None:
    with (
        stub_server(reply(200, "text/event-stream", b"data: {not json\n\n")) as url,
        pytest.raises(ModelError, match="sent a garbled stream"),
    ):
        list(stream_remote(RemoteEngine(url), HELLO, GenerationParams(), threading.Event()))


def test_stream_cut_before_the_end() -> None:
    first = b'data: {"choices": [{"delta": {"content": "Hi"}, "finish_reason": null}]}\n\n'
    with (
        stub_server(reply(200, "text/event-stream", first)) as url,
        pytest.raises(ModelError, match="closed the stream before the reply ended"),
    ):
        list(stream_remote(RemoteEngine(url), HELLO, GenerationParams(), threading.Event()))


def test_timeout_is_one_line() -> None:
    gate = threading.Event()

    def slow(h: BaseHTTPRequestHandler) -> None:
        gate.wait(5)

    with stub_server(slow) as url:
        try:
            with pytest.raises(ModelError, match=r"did not answer within 0\.3 s$"):
                list(
                    stream_remote(
                        RemoteEngine(url), HELLO, GenerationParams(), threading.Event(), timeout=0.3
                    )
                )
        finally:
            gate.set()


def test_llama_server_stream_reports_request_drafts() -> None:
    # Shapes from llama.cpp's tools/server/README.md: timings on the final chunk.
    events = [
        {"choices": [{"delta": {"content": "Hello"}, "finish_reason": None}]},
        {"choices": [{"delta": {"content": " there"}, "finish_reason": "stop"}]},
        {
            "choices": [],
            "usage": {"prompt_tokens": 7, "completion_tokens": 2},
            "timings": {
                "prompt_n": 7,
                "prompt_ms": 20.0,
                "predicted_n": 2,
                "predicted_ms": 50.0,
                "draft_n": 8,
                "draft_n_accepted": 6,
            },
        },
    ]
    import json

    body = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
    with stub_server(reply(200, "text/event-stream", body)) as url:
        out = list(
            stream_remote(
                RemoteEngine(url, "llama-server"), HELLO, GenerationParams(), threading.Event()
            )
        )
    *chunks, done = out
    assert [c.text for c in chunks if isinstance(c, Chunk)] == ["Hello", " there"]
    assert isinstance(done, Finished) and done.finish_reason == "stop"
    assert (done.stats.drafted, done.stats.accepted, done.stats.stats_scope) == (8, 6, "request")
    assert done.stats.generation_seconds == pytest.approx(0.05)
    assert done.stats.generation_tps == pytest.approx(40.0)


def test_target_round_trip_keeps_kind_model_and_draft() -> None:
    engine = RemoteEngine("http://Studio.local:8080/v1/", "mlx-lm", "qwen", "/m/draft")
    back = RemoteEngine.from_target(engine.to_target())
    assert back == engine
    assert engine.url == "http://Studio.local:8080"
    assert engine.label == "remote: qwen @ Studio.local:8080"
    with pytest.raises(ValueError, match="unknown server kind"):
        RemoteEngine.from_target("http://h:1#kind=tgi")


def _sse(events: Sequence[object]) -> bytes:
    import json

    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def _routed(routes: dict[str, bytes], seen: list[str]):  # type: ignore[no-untyped-def]
    """A POST handler that streams ``routes[path]`` and answers 404 on any other path."""

    def handle(h: BaseHTTPRequestHandler) -> None:
        seen.append(h.path)
        if h.path in routes:
            reply(200, "text/event-stream", routes[h.path])(h)
        else:
            reply(404, "application/json", b'{"error": "Unexpected endpoint or method."}')(h)

    return handle


def test_lmstudio_streams_from_the_native_api_with_draft_stats() -> None:
    """Shapes from LM Studio's docs, "LM Studio REST API (beta)": ``stats`` on the final chunk."""
    events = [
        {"choices": [{"delta": {"content": "Hello"}, "finish_reason": None}]},
        {"choices": [{"delta": {"content": " there"}, "finish_reason": "stop"}]},
        {
            "choices": [],
            "usage": {"prompt_tokens": 7, "completion_tokens": 2},
            "stats": {
                "tokens_per_second": 40.0,
                "time_to_first_token": 0.02,
                "generation_time": 0.05,
                "stop_reason": "eosFound",
                "draft_model": "qwen2.5-0.5b-instruct",
                "total_draft_tokens_count": 9,
                "accepted_draft_tokens_count": 5,
                "rejected_draft_tokens_count": 3,
                "ignored_draft_tokens_count": 1,
            },
            "model_info": {"arch": "qwen2", "quant": "Q4_K_M", "format": "gguf"},
            "runtime": {"name": "llama.cpp-mac-arm64-apple-metal-advsimd", "version": "1.3.0"},
        },
    ]
    seen: list[str] = []
    with stub_server(_routed({"/api/v0/chat/completions": _sse(events)}, seen)) as url:
        engine = RemoteEngine(url, "lmstudio", "qwen2.5-7b-instruct", "qwen2.5-0.5b-instruct")
        *chunks, done = list(stream_remote(engine, HELLO, GenerationParams(), threading.Event()))
    assert seen == ["/api/v0/chat/completions"]
    assert [c.text for c in chunks if isinstance(c, Chunk)] == ["Hello", " there"]
    assert isinstance(done, Finished) and done.finish_reason == "stop"
    assert (done.stats.drafted, done.stats.accepted, done.stats.stats_scope) == (9, 5, "request")
    assert done.stats.generation_seconds == pytest.approx(0.05)
    assert done.stats.prompt_seconds == pytest.approx(0.02)


def test_older_lmstudio_without_the_native_api_falls_back_to_v1() -> None:
    """An LM Studio older than its REST API (beta) 404s on /api/v0; /v1 has no ``stats``."""
    events = [
        {"choices": [{"delta": {"content": "Hi"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
    ]
    seen: list[str] = []
    with stub_server(_routed({"/v1/chat/completions": _sse(events)}, seen)) as url:
        engine = RemoteEngine(url, "lmstudio", "qwen2.5-7b-instruct", "qwen2.5-0.5b-instruct")
        *chunks, done = list(stream_remote(engine, HELLO, GenerationParams(), threading.Event()))
    assert seen == ["/api/v0/chat/completions", "/v1/chat/completions"]
    assert [c.text for c in chunks if isinstance(c, Chunk)] == ["Hi"]
    assert isinstance(done, Finished)
    assert (done.stats.tokens, done.stats.drafted, done.stats.stats_scope) == (1, 0, "not reported")


def test_other_kinds_use_only_the_openai_endpoint() -> None:
    seen: list[str] = []
    with (
        stub_server(_routed({}, seen)) as url,
        pytest.raises(ModelError, match=r"/v1/chat/completions was not found \(HTTP 404\)"),
    ):
        list(stream_remote(RemoteEngine(url, "vllm"), HELLO, GenerationParams(), threading.Event()))
    assert seen == ["/v1/chat/completions"]


def test_stop_ends_a_read_from_a_silent_server_at_once() -> None:
    import json
    import time

    def silent(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        chunk = {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}
        h.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        h.wfile.flush()
        time.sleep(10)  # then nothing: the server is thinking, or stuck

    with stub_server(silent) as url:
        cancel = threading.Event()
        events = stream_remote(
            RemoteEngine(url, "openai-compatible"), HELLO, GenerationParams(), cancel, key=""
        )
        first = next(events)
        assert isinstance(first, Chunk) and first.text == "Hi"
        threading.Timer(0.2, cancel.set).start()
        start = time.monotonic()
        *_, done = events
        assert isinstance(done, Finished) and done.finish_reason == "cancelled"
        assert time.monotonic() - start < 3  # not the 120 s read timeout


def test_raw_unicode_line_breaks_inside_an_event_are_text_not_line_ends() -> None:
    text = "a\u0085b\u2028c\u2029d"
    delta = {"choices": [{"delta": {"content": text}, "finish_reason": None}]}
    body = (
        f"data: {json.dumps(delta, ensure_ascii=False)}\n\n"
        'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\r\n\r\n'
        "data: [DONE]\r\r"
    ).encode()
    with stub_server(reply(200, "text/event-stream", body)) as url:
        events = list(
            stream_remote(RemoteEngine(url), HELLO, GenerationParams(), threading.Event(), key="")
        )
    assert "".join(e.text for e in events if isinstance(e, Chunk)) == text
    assert isinstance(events[-1], Finished) and events[-1].finish_reason == "stop"


def test_sse_lines_end_only_at_cr_lf_and_crlf_even_split_between_pieces() -> None:
    pieces = ["one\u2028x\r", "\ntwo\rthree\n", "\n", "four\r"]
    assert list(sse_lines(pieces)) == ["one\u2028x", "two", "three", "", "four"]
