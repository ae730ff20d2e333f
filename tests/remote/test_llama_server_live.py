"""Tandem's llama-server adapter against a real ``llama-server``, when there is one.

Skipped unless ``llama-server`` is on ``PATH`` (``brew install llama.cpp``, or a
release from github.com/ggml-org/llama.cpp) and ``TANDEM_TEST_GGUF`` names a small
GGUF model; ``TANDEM_TEST_DRAFT_GGUF`` may name its draft, else the target drafts
for itself (every drafted token accepted at temperature 0). Nothing is downloaded;
the server listens on 127.0.0.1 only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.engine.types import Chunk, Finished, GenerationParams, Message
from app.remote import RemoteEngine, check_remote, stream_remote
from tests.remote.servers import free_port

SERVER = shutil.which("llama-server")
GGUF = os.environ.get("TANDEM_TEST_GGUF", "")
DRAFT = os.environ.get("TANDEM_TEST_DRAFT_GGUF", "") or GGUF
K = 4

pytestmark = [
    pytest.mark.skipif(
        SERVER is None,
        reason="no llama-server on PATH (brew install llama.cpp, or a release "
        "from github.com/ggml-org/llama.cpp)",
    ),
    pytest.mark.skipif(
        not GGUF or not Path(GGUF).expanduser().is_file(),
        reason="TANDEM_TEST_GGUF does not name a GGUF file (a small model, e.g. a 0.5B q8_0)",
    ),
]


def _draft_flags(help_text: str) -> list[str]:
    """The draft flags this build knows: current builds draft only with --spec-type."""
    draft = ["-md", str(Path(DRAFT).expanduser())]
    if "--spec-type" in help_text:
        draft += ["--spec-type", "draft-simple"]
    if "--spec-draft-n-max" in help_text:
        return [*draft, "--spec-draft-n-max", str(K), "--spec-draft-n-min", "1"]
    return [*draft, "--draft-max", str(K), "--draft-min", "1"]


@pytest.fixture(scope="module")
def llama_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    assert SERVER is not None
    help_text = subprocess.run(
        [SERVER, "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [SERVER, "-m", str(Path(GGUF).expanduser()), *_draft_flags(help_text)]
    command += ["--host", "127.0.0.1", "--port", str(port), "-c", "2048", "-np", "1"]
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"llama-server exited: {log.read_text()[-2000:]}")
                try:
                    if httpx.get(url + "/health", timeout=1.0).is_success:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"llama-server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def test_the_adapter_reads_a_real_servers_reply_and_drafts(llama_url: str) -> None:
    engine = RemoteEngine(llama_url, "llama-server")
    check_remote(engine, key="")
    messages = [Message("user", "Count from one to twenty in words, separated by commas.")]
    params = GenerationParams(max_tokens=48, temperature=0, seed=1)

    events = list(stream_remote(engine, messages, params, threading.Event(), key=""))

    *chunks, done = events
    texts = [c.text for c in chunks if isinstance(c, Chunk)]
    assert chunks and len(texts) == len(chunks)
    assert "".join(texts).strip()
    assert isinstance(done, Finished)
    assert done.finish_reason in {"stop", "length"}
    stats = done.stats
    # The server's own per-request counts, read from its `timings`.
    assert stats.stats_scope == "request"
    assert stats.drafted > 0, "llama-server drafted nothing: are the draft flags right?"
    assert 0 <= stats.accepted <= stats.drafted
    if DRAFT == GGUF:
        assert stats.accepted > 0  # the target drafting for itself agrees with itself
    assert stats.generation_tps > 0
