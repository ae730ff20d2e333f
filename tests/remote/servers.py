"""Servers for the remote-engine tests: a real mlx_lm.server and a scripted stub.

Both listen on 127.0.0.1 only; nothing here reaches another host.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx


def free_port() -> int:
    """A port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def mlx_server(model: Path, log: Path, *, startup: float = 60.0) -> Iterator[str]:
    """Runs ``python -m mlx_lm.server`` on ``model``; yields its base URL, always kills it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "mlx_lm.server", "--model", str(model)]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + startup
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"mlx_lm.server exited: {log.read_text()[-2000:]}")
                try:
                    if httpx.get(url + "/health", timeout=1.0).is_success:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"mlx_lm.server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


Handler = Callable[[BaseHTTPRequestHandler], None]


@contextmanager
def stub_server(post: Handler, get: Handler | None = None) -> Iterator[str]:
    """A local HTTP server whose POST (and GET) answers are scripted; yields its base URL."""

    class _Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            self.rfile.read(length)
            post(self)

        def do_GET(self) -> None:
            if get is None:
                self.send_response(404)
                self.end_headers()
            else:
                get(self)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def reply(status: int, ctype: str, body: bytes) -> Handler:
    """A handler that answers with one fixed response."""

    def handle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return handle
