"""SIGTERM to `tandem serve` mid-batch: every reply it cuts says it was cut."""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

import httpx
import pytest

from tests.conftest import TinyModels
from tests.fakes import MESSAGES, _free_port, _kill, _start, served_url

# Sampled with this seed the tiny pair writes some 1,100 tokens on the server: seconds
# of work, so the replies are still running (or waiting) when the signal comes.
LONG: dict[str, Any] = {
    "messages": MESSAGES,
    "max_tokens": 3000,
    "temperature": 1,
    "seed": 7,
    "num_draft_tokens": 3,
}


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10).text
    rows = (line.split() for line in text.splitlines() if not line.startswith("#"))
    return {name: float(value) for name, value in rows}


@pytest.mark.slow
def test_sigterm_mid_batch_cuts_replies_with_an_error_not_a_finish(tiny: TinyModels) -> None:
    port = _free_port()
    models = ["--model", str(tiny.target), "--draft", str(tiny.noisy)]
    process = _start([*models, "--port", str(port), "--parallel", "2"])
    try:
        url = served_url(process)
        events: list[str] = []
        answers: dict[str, httpx.Response] = {}
        streaming = threading.Event()

        def stream() -> None:
            body = {**LONG, "stream": True}
            with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line.removeprefix("data: "))
                        streaming.set()

        def whole(name: str) -> None:
            answers[name] = httpx.post(f"{url}/chat/completions", json=LONG, timeout=60)

        threads = [threading.Thread(target=stream)]
        threads += [threading.Thread(target=whole, args=(name,)) for name in ("running", "queued")]
        for t in threads:
            t.start()
            time.sleep(0.2)  # in this order: the third waits for a place
        assert streaming.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = _metrics(url)
            if (m["tandem_requests_running"], m["tandem_requests_waiting"]) == (2, 1):
                break
            time.sleep(0.02)
        assert (m["tandem_requests_running"], m["tandem_requests_waiting"]) == (2, 1), m
        process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        process.communicate(timeout=60)
        assert process.returncode == 0
    finally:
        _kill(process)

    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    assert len(chunks) > 2  # the role, then text
    *replies, cut = chunks
    assert all(c["choices"][0]["finish_reason"] is None for c in replies)  # no made-up end
    assert cut["error"]["type"] == "server_error"
    assert "shutting down" in cut["error"]["message"]
    for name in ("running", "queued"):
        assert answers[name].status_code == 503, (name, answers[name].text)
        assert "shutting down" in answers[name].json()["error"]["message"]
