"""Concurrent streams on the real `tandem serve`: each reply is what it is alone.

The load test of batched serving: 1, 2, 4 and 8 streams at once through the
real OpenAI client, on loopback, bounded in count and time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from app.engine import GenerationParams, load_pair
from app.engine.generate import stream_reply
from app.engine.types import Chunk, DraftSetting, Finished, Message
from tests.conftest import TinyModels
from tests.fakes import KEY, Server, _free_port, _kill, _start, served_url

TOKENS = 48
TOPICS = ("cats", "dogs", "rain", "salt", "maps", "bees", "tea", "ice")
PROMPTS = [f"Tell me about {topic}." for topic in TOPICS]


@pytest.fixture(scope="module")
def server(tiny: TinyModels) -> Iterator[Server]:
    port = _free_port()
    args = ["--model", str(tiny.target), "--draft", str(tiny.noisy), "--port", str(port)]
    process = _start([*args, "--api-key", KEY, "--parallel", "8"])
    try:
        yield Server(served_url(process), port, process)
    finally:
        _kill(process)


@pytest.fixture(scope="module")
def solo(tiny: TinyModels) -> dict[str, str]:
    """Each prompt's greedy reply alone, without the draft, in this process."""
    pair = load_pair(tiny.target)
    out = {}
    for prompt in PROMPTS:
        params = GenerationParams(max_tokens=TOKENS, temperature=0, drafting=DraftSetting.of(0))
        events = list(stream_reply(pair, [Message("user", prompt)], params))
        assert isinstance(events[-1], Finished)
        out[prompt] = "".join(e.text for e in events if isinstance(e, Chunk))
    return out


def _stream(
    client: openai.OpenAI, prompt: str, num_draft: int | str, start: threading.Barrier
) -> str:
    start.wait(30)
    stream = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=TOKENS,
        temperature=0,
        stream=True,
        extra_body={"num_draft_tokens": num_draft},
    )
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def _metrics(server: Server) -> dict[str, float]:
    # Behind the key, like the API: how busy the server is is the key holder's business.
    key = {"Authorization": f"Bearer {KEY}"}
    response = httpx.get(f"http://127.0.0.1:{server.port}/metrics", headers=key, timeout=10)
    assert response.status_code == 200
    text = response.text
    rows = (line.split() for line in text.splitlines() if not line.startswith("#"))
    return {name: float(value) for name, value in rows}


@pytest.mark.slow
@pytest.mark.parametrize("streams", [1, 2, 4, 8])
def test_concurrent_greedy_streams_equal_their_solo_replies(
    server: Server, solo: dict[str, str], streams: int
) -> None:
    prompts = PROMPTS[:streams]
    got: dict[str, str] = {}
    errors: list[BaseException] = []
    # Clients are built first and the requests leave together: on a slow host a
    # short reply could otherwise end before the next one arrives.
    clients = [server.client() for _ in prompts]
    start = threading.Barrier(streams)

    def one(client: openai.OpenAI, prompt: str, num_draft: int | str) -> None:
        try:
            got[prompt] = _stream(client, prompt, num_draft, start)
        except (openai.OpenAIError, httpx.HTTPError) as exc:
            errors.append(exc)

    # Fixed and adaptive draft lengths side by side in one batch. A lone stream drafts a
    # fixed k: on a tiny pair's costs Auto may rule drafting out, and accept nothing.
    threads = [
        threading.Thread(target=one, args=(c, p, "auto" if i % 2 else 3))
        for i, (c, p) in enumerate(zip(clients, prompts, strict=True))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert got == {p: solo[p] for p in prompts}
    # The engine reports its load just after a reply's last token: wait for that report.
    deadline = time.monotonic() + 5
    while (metrics := _metrics(server))["tandem_requests_running"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert metrics["tandem_requests_running"] == 0
    assert metrics["tandem_batch_size_max"] == 8
    assert 0 < metrics["tandem_batch_acceptance"] <= 1
    if streams > 1:
        assert metrics["tandem_batch_largest"] >= 2  # rounds were shared
