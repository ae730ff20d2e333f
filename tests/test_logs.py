"""The log file: where it goes, how it rotates, and what it never holds."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import platformdirs
import pytest

from app import logs

TOKEN = "hf_LogTestToken0123456789abcdefXYZ"


@pytest.fixture
def logged(tmp_path: Path) -> Iterator[Path]:
    """Logging set up into a temporary folder, removed afterwards."""
    path = logs.setup_logging(tmp_path / "logs", debug=False)
    yield path
    logs.stop_logging()


def _text(path: Path) -> str:
    for handler in logging.getLogger().handlers:
        handler.flush()
    return path.read_text(encoding="utf-8")


def test_the_log_lives_in_the_user_log_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(logs.DEBUG_ENV, raising=False)
    try:
        path = logs.setup_logging()
        logging.getLogger("app.test").info("hello from the test")
        expected = Path(platformdirs.user_log_dir("Tandem", appauthor=False)) / "tandem.log"
        assert path == expected == logs.log_path()
        assert "INFO" in _text(path) and "hello from the test" in _text(path)
    finally:
        logs.stop_logging()
    assert logs.log_path() is None


def test_the_log_rotates_at_one_megabyte_keeping_three(logged: Path) -> None:
    line = "x" * 1_000
    for _ in range(5_000):  # about 5 MB
        logging.getLogger("app.test").info(line)
    names = sorted(p.name for p in logged.parent.iterdir())
    assert names == ["tandem.log", "tandem.log.1", "tandem.log.2", "tandem.log.3"]
    assert all(p.stat().st_size <= logs.MAX_BYTES for p in logged.parent.iterdir())


def test_setting_up_again_replaces_the_handlers(tmp_path: Path) -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        logs.setup_logging(tmp_path / "a")
        path = logs.setup_logging(tmp_path / "b")
        added = [h for h in root.handlers if h not in before]
        assert len(added) == 2  # one file, one stderr
        logging.getLogger("app.test").warning("only once")
        assert _text(path).count("only once") == 1
    finally:
        logs.stop_logging()
    assert root.handlers == before


def test_tokens_never_reach_the_log(logged: Path) -> None:
    log = logging.getLogger("app.hub.test")
    log.error(f"request failed: Authorization: Bearer {TOKEN}")
    log.error("request with %s failed", TOKEN)
    log.warning("token=%(token)s", {"token": TOKEN})
    try:
        raise RuntimeError(f"401 Unauthorized\n  header: {TOKEN}\n")
    except RuntimeError:
        log.exception("download failed")
    log.error("stack", stack_info=True, extra={"detail": "ignored"})
    text = _text(logged)
    assert TOKEN not in text
    assert "request failed: Authorization: ***" in text  # a header's value goes whole
    assert text.count("hf_***") == 3
    # Tracebacks keep their shape.
    assert "Traceback (most recent call last):" in text
    assert "\n  header: hf_***\n" in text
    assert "RuntimeError: 401 Unauthorized" in text


def test_scrub_text_keeps_lines_and_indents() -> None:
    text = f"first {TOKEN}\n\n    second\r\n\tthird {TOKEN} end  \n"
    assert logs.scrub_text(text) == "first hf_***\n\n    second\r\n\tthird hf_*** end  \n"
    assert logs.scrub_text("") == ""


def test_chat_text_is_logged_only_in_debug_logging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret_chat = "my bank PIN is 4921"
    monkeypatch.delenv(logs.DEBUG_ENV, raising=False)
    assert logs.private(secret_chat) == "<19 characters>"
    try:
        path = logs.setup_logging(tmp_path / "plain")
        log = logging.getLogger("app.test")
        log.debug("debug record: %s", secret_chat)
        log.info("reply to: %s", logs.private(secret_chat))
        assert secret_chat not in _text(path)
        assert "reply to: <19 characters>" in _text(path)

        monkeypatch.setenv(logs.DEBUG_ENV, "1")
        assert logs.private(secret_chat) == secret_chat
        path = logs.setup_logging(tmp_path / "debug")
        log.debug("debug record: %s", secret_chat)
        log.info("reply to: %s", logs.private(secret_chat))
        assert f"debug record: {secret_chat}" in _text(path)
        assert f"reply to: {secret_chat}" in _text(path)
    finally:
        logs.stop_logging()


def test_a_clients_megabytes_reach_even_a_debug_log_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(logs.DEBUG_ENV, "1")
    flood = "x" * 4_000_000
    kept = logs.private(flood)
    assert kept.startswith("x" * logs.LOG_TEXT_MAX) and kept.endswith("… <4000000 characters>")
    assert len(kept) < logs.LOG_TEXT_MAX + 40


def test_setup_restores_the_root_level_when_stopped(tmp_path: Path) -> None:
    root = logging.getLogger()
    level = root.level
    logs.setup_logging(tmp_path, debug=True)
    assert root.level == logging.DEBUG
    logs.stop_logging()
    assert root.level == level


def test_server_and_remote_keys_never_reach_the_log(logged: Path) -> None:
    key = "sk-server-key-0123456789"
    logs.hide_secret(key)
    log = logging.getLogger("aiohttp.server")
    try:  # aiohttp's parse error quotes the whole header
        raise ValueError(f"Invalid header value char:\n\n    b'Authorization: Bearer {key}\\x00'")
    except ValueError:
        log.exception("Error handling request from 127.0.0.1")
    log.error("key was %s", key)
    log.error("remote said: bearer remote-engine-key-42 is not allowed")
    text = _text(logged)
    assert key not in text and "remote-engine-key-42" not in text
    assert "Authorization: ***" in text and "key was ***" in text and "bearer ***" in text


def test_a_burst_of_failures_is_one_line(logged: Path) -> None:
    log = logging.getLogger("app.test.burst")
    burst = logs.BurstFilter(seconds=0.5)
    log.addFilter(burst)
    try:
        for i in range(1_000):
            try:
                raise OSError(24, f"Too many open files {i}")
            except OSError:
                log.exception("accept failed")
        time.sleep(0.6)  # the burst is over
        log.error("accept failed again")
    finally:
        log.removeFilter(burst)
    text = _text(logged)
    assert text.count("accept failed") == 2
    assert "Traceback" not in text and "OSError: [Errno 24] Too many open files 0" in text
    assert "(999 more like it in the last burst, not logged)" in text
