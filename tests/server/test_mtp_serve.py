"""`tandem serve --draft mtp`: a target drafting with its own head answers over HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import TinyModels
from tests.engine.families import mtp_model
from tests.fakes import served_url


def test_a_target_serving_with_its_own_head_reports_its_drafts(
    tiny: TinyModels, tmp_path: Path
) -> None:
    target = mtp_model(tmp_path / "qwen3.5-tiny", tiny.target)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--model", str(target), "--draft", "mtp",
         "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
    )  # fmt: skip
    try:
        served_url(process)  # it listens
        body = {
            "messages": [{"role": "user", "content": "Say something"}],
            "max_tokens": 12,
            "temperature": 0,
            "num_draft_tokens": 3,
        }
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        timings = reply.json()["timings"]
        assert timings["draft_n"] > 0  # the head drafted
    finally:
        process.kill()
        process.wait(10)
