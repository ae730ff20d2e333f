"""Caller mistakes get a clear answer: 4xx from the server, exit 2 and one line from the CLI.

Each case of issue 14 runs against a real ``tandem serve`` and the real CLI, on
tiny models; after each, the server still answers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import TinyModels
from tests.fakes import served_url

KEY = "caller-mistakes-key-0123456789"
MESSAGES = [{"role": "user", "content": "Hi"}]
TOO_LONG = "hello " * 6_000  # over the tiny target's window of 4,096 tokens


@dataclass(frozen=True)
class Served:
    port: int
    logs: Path
    process: subprocess.Popen[str]

    def raw(self, request: bytes, timeout: float = 30, one_answer: bool = False) -> bytes:
        """Sends ``request`` as is and returns everything the server answers.

        That is all it sends until it closes the connection or ``timeout`` passes
        in silence; with ``one_answer``, the first whole answer (headers and the
        body they announce), for a server that keeps the connection open waiting
        for the rest of a request that was not all sent.
        """
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(request)
            chunks = []
            try:
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
                    if one_answer and _whole_answer(b"".join(chunks)):
                        break
            except TimeoutError:  # an answer before the whole request was sent
                pass
        return b"".join(chunks)

    def post(self, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        return httpx.post(
            f"http://127.0.0.1:{self.port}/v1/chat/completions",
            content=body,
            headers={"Authorization": f"Bearer {KEY}", **(headers or {})},
            timeout=60,
        )


def _whole_answer(data: bytes) -> bool:
    """Whether ``data`` holds a response's headers and all of the body they announce."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    lengths = [
        line.split(b":", 1)[1].strip()
        for line in head.split(b"\r\n")[1:]
        if line.lower().startswith(b"content-length:")
    ]
    return len(lengths) == 1 and lengths[0].isdigit() and len(body) >= int(lengths[0])


@pytest.fixture(scope="module")
def served(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    state = tmp_path_factory.mktemp("state")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["--model", str(tiny.target), "--draft", str(tiny.noisy), "--port", str(port)]
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", *args, "--api-key", KEY],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TANDEM_DEBUG_LOG": "0", "XDG_STATE_HOME": str(state)},
    )
    try:
        served_url(process)  # it listens
        yield Served(port, state / "Tandem" / "log", process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def _body(**fields: object) -> bytes:
    return json.dumps({"messages": MESSAGES, "max_tokens": 4, **fields}).encode()


def _still_answers(served: Served) -> None:
    reply = served.post(_body())
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["role"] == "assistant"


BAD_BODIES = [
    (b'{"messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}', "temperature"),
    (b'{"messages": [{"role": "user", "content": "Hi"}], "top_p": Infinity}', "top_p"),
    (_body(top_p=2), "top_p"),
    (_body(top_p=-1), "top_p"),
    (_body(top_k=-5), "top_k"),
    (_body(repetition_penalty=-1), "repetition_penalty"),
    (_body(repetition_penalty=0), "repetition_penalty"),
    (_body(min_p=5, temperature=1), "min_p"),
    (_body(seed=-1), "seed"),
    (_body(seed=2**64), "seed"),
    (_body(seed=2**70), "seed"),
    (_body(max_tokens=0), "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages[0].content"),
    (b'{"messages": [{"role": "user", "content": "Hi"}], "model": "\\udfff"}', "model"),
    (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', None),  # not UTF-8
    (b"[" * 100_000 + b"]" * 100_000, None),  # nested too deep
]


@pytest.mark.parametrize(("body", "param"), BAD_BODIES)
def test_bad_requests_get_400_with_an_openai_error(
    served: Served, body: bytes, param: str | None
) -> None:
    for stream in (False, True):
        sent = body
        if stream and body.startswith(b'{"messages"'):
            sent = body[:-1] + b', "stream": true}'
        reply = served.post(sent)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"] == param
        assert "\n" not in error["message"]
    _still_answers(served)


def test_the_largest_seed_is_taken(served: Served) -> None:
    reply = served.post(_body(seed=2**64 - 1, temperature=1.0))
    assert reply.status_code == 200, reply.text


def test_a_conversation_over_the_window_is_400_also_when_streaming(served: Served) -> None:
    messages = [{"role": "user", "content": TOO_LONG}]
    for stream in (False, True):
        body = json.dumps({"messages": messages, "max_tokens": 4, "stream": stream}).encode()
        reply = served.post(body)
        assert reply.status_code == 400, reply.text  # before any 200 when streaming
        assert reply.json()["error"]["code"] == "context_length_exceeded"
    _still_answers(served)


@pytest.mark.parametrize(
    "authorization", [b"Bearer \xff\xfe", b"Bearer \xed\xa0\x80", b"\xff", b"Basic " + b"x" * 9]
)
def test_a_malformed_authorization_is_401(served: Served, authorization: bytes) -> None:
    answer = served.raw(
        b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        b"Authorization: " + authorization + b"\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b'"invalid_api_key"' in answer
    _still_answers(served)


def test_a_declared_body_over_the_limit_is_413_before_it_is_sent(served: Served) -> None:
    answer = served.raw(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
        b"Content-Length: 17000000\r\n\r\n",  # and no body at all
        timeout=3,
        one_answer=True,
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"invalid_request_error" in answer
    _still_answers(served)


def test_the_key_in_a_broken_header_never_reaches_the_log(served: Served) -> None:
    for _ in range(3):
        answer = served.raw(
            b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n"
            b"Authorization: Bearer " + KEY.encode() + b"\x00\r\n\r\n"
        )
        # A malformed Authorization is a wrong key: 401, as JSON, echoing nothing.
        # (HTTP/1.0: aiohttp could not read the request's version.)
        assert answer.split(b"\r\n")[0].endswith(b" 401 Unauthorized"), answer[:200]
        assert b"invalid_api_key" in answer and KEY.encode() not in answer
    answer = served.raw(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Odd: a\x00b\r\n\r\n")
    assert b" 400 " in answer.split(b"\r\n")[0] and b"invalid_request_error" in answer
    _still_answers(served)
    logged = "".join(p.read_text(errors="replace") for p in served.logs.iterdir())
    assert "tandem.log" in {p.name for p in served.logs.iterdir()}
    assert KEY not in logged
    assert "Traceback" not in logged


def _tandem(*args: str | bytes, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def _one_line(result: subprocess.CompletedProcess, *words: str) -> None:
    err = result.stderr.decode(errors="replace")
    assert result.returncode == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tandem: "), err
    assert all(w in lines[0] for w in words), err


CLI_CASES = [
    (("--seed", "-1"), ("--seed", "0 to 18446744073709551615")),
    (("--seed", str(2**70)), ("--seed",)),
    (("--temp", "nan"), ("--temp", "nan")),
    (("--temp", "inf"), ("--temp",)),
    (("--top-p", "2"), ("--top-p",)),
    (("--top-p", "-1"), ("--top-p",)),
    (("--top-p", "nan"), ("--top-p",)),
    (("--top-k", "-5"), ("--top-k",)),
    (("--repetition-penalty", "-1"), ("--repetition-penalty",)),
    (("--repetition-penalty", "nan"), ("--repetition-penalty",)),
    (("--min-p", "5", "--temp", "1"), ("--min-p", "0 to 1")),
    (("--max-tokens", "0"), ("--max-tokens",)),
]


def test_the_cli_process_refuses_a_bad_value_in_one_line(tiny: TinyModels) -> None:
    options, words = CLI_CASES[0]
    _one_line(_tandem("generate", "--model", str(tiny.target), *options, "Hi"), *words)


@pytest.mark.parametrize(("options", "words"), CLI_CASES)
def test_cli_refuses_bad_values_in_one_line(
    tiny: TinyModels,
    capsys: pytest.CaptureFixture[str],
    options: tuple[str, ...],
    words: tuple[str, ...],
) -> None:
    # In this process: the same entry point as the one above, without starting Python again.
    from app import cli

    try:
        code = cli.main(["generate", "--model", str(tiny.target), *options, "Hi"])
    except SystemExit as exc:  # argparse's own refusals
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    _one_line(subprocess.CompletedProcess([], code, b"", err.encode()), *words)


@pytest.mark.parametrize("prompt", [b"\xff\xfe", b"a\xed\xa0\x80b"])  # not UTF-8; a surrogate
def test_cli_refuses_text_that_is_not_utf8(tiny: TinyModels, prompt: bytes) -> None:
    _one_line(_tandem("generate", "--model", str(tiny.target), prompt), "the prompt", "UTF-8")


def test_cli_refuses_a_prompt_over_the_window(tiny: TinyModels) -> None:
    result = _tandem("generate", "--model", str(tiny.target), "--max-tokens", "4", TOO_LONG)
    _one_line(result, "window of 4,096")


@pytest.mark.parametrize("command", [("models", "list"), ("models", "import", "nowhere.gguf")])
def test_cli_says_in_one_line_when_the_data_folder_is_unusable(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # refused even to root, unlike a read-only folder
    _one_line(_tandem(*command, env={"XDG_DATA_HOME": str(blocker)}), "models folder")


def test_cli_token_set_at_end_of_input_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "memory_keyring.py").write_text(
        "from keyring.backend import KeyringBackend\n"
        "class Memory(KeyringBackend):\n"
        "    priority = 1\n"
        "    def get_password(self, service, username): return None\n"
        "    def set_password(self, service, username, password): raise AssertionError\n"
        "    def delete_password(self, service, username): pass\n"
    )
    env = {
        "PYTHON_KEYRING_BACKEND": "memory_keyring.Memory",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    result = _tandem("token", "set", env=env)
    err = result.stderr.decode()
    assert result.returncode == 2 and "Traceback" not in err, err
    # Above it: getpass's own prompt, and its warning that it cannot hide the input.
    assert err.splitlines()[-1].startswith("tandem: no token given (end of input)"), err
