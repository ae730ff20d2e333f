"""`tandem serve`'s quick refusals: key length and whitespace, a taken port, --api-key's warning."""

from __future__ import annotations

import socket
import time

from app.server.security import MIN_REMOTE_KEY
from tests.fakes import _tandem, _tandem_here

KEY = "k" * MIN_REMOTE_KEY


def test_off_loopback_a_short_key_is_refused_in_one_line() -> None:
    r = _tandem_here("serve", "--model", "/nonexistent", "--host", "0.0.0.0", "--port", "0", env={
        "TANDEM_API_KEY": "ab",
    })  # fmt: skip
    assert r.returncode == 2
    refusal = [line for line in r.stderr.splitlines() if "at least 16 characters" in line]
    assert len(refusal) == 1 and refusal[0].startswith("tandem: ")


def test_a_taken_port_is_refused_before_the_pair_loads() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        # A process, as a user runs it: without the early check it would go on to load.
        r = _tandem("serve", "--model", "/nonexistent", "--port", str(port))
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"tandem: cannot listen on 127.0.0.1:{port}: ")
    assert "nonexistent" not in r.stderr  # said before the model was looked at
    assert time.monotonic() - started < 60


def test_api_key_on_the_command_line_warns_in_one_line_and_still_works() -> None:
    # A short key off loopback: refused at once, after the warning, which names the way out.
    r = _tandem_here("serve", "--model", "/nonexistent", "--host", "0.0.0.0", "--port", "0",
                     "--api-key", "ab")  # fmt: skip
    warnings = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "TANDEM_API_KEY" in warnings[0]
    assert r.returncode == 2  # the flag's key was the one checked
    assert "at least 16 characters" in r.stderr
    r = _tandem_here("serve", "--model", "/nonexistent", "--host", "0.0.0.0", "--port", "0",
                     env={"TANDEM_API_KEY": "ab"})  # fmt: skip
    assert "warning" not in r.stderr  # the variable needs no warning


def test_a_key_with_a_trailing_newline_counts_without_it() -> None:
    # 15 characters and a newline: the newline does not make it long enough.
    r = _tandem_here("serve", "--model", "/nonexistent", "--host", "0.0.0.0", "--port", "0",
                     env={"TANDEM_API_KEY": KEY[1:] + "\n"})  # fmt: skip
    assert r.returncode == 2 and "at least 16 characters" in r.stderr


def test_help_says_to_prefer_the_environment_variable() -> None:
    r = _tandem("serve", "--help")
    assert r.returncode == 0
    help_text = " ".join(r.stdout.split())  # as argparse wraps it
    assert "see it in `ps`: prefer $TANDEM_API_KEY" in help_text
