"""Privacy: a chat never touches the network, and the Hub token is never written anywhere."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import keyring
import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app import logs
from app.services import EngineWorker
from tests.conftest import TinyModels
from tests.fakes import MemoryKeyring, _fake_load, _scripted

TOKEN = "hf_PrivacyTestToken0123456789abcdefXYZ"


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Makes every way to open a connection fail and records each attempt."""
    import huggingface_hub.constants

    attempts: list[str] = []

    def refuse(name: str) -> Callable[..., None]:
        def blocked(*_args: object, **_kwargs: object) -> None:
            attempts.append(name)
            raise OSError(f"the test blocks network access ({name})")

        return blocked

    monkeypatch.setattr(socket.socket, "__init__", refuse("socket"))
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection"))
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    # Online mode, so a Hub call would try to connect rather than fail quietly.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(OSError, match="blocks network"):
        socket.socket()
    with pytest.raises(OSError, match="blocks network"):
        socket.create_connection(("huggingface.co", 443))
    attempts.clear()
    return attempts


def test_a_whole_chat_runs_without_the_network(
    qtbot: QtBot, make_window, tiny: TinyModels, no_network: list[str]
) -> None:
    window = make_window()
    window.model_bar.target_edit.setText(str(tiny.target))
    window.model_bar.draft_edit.setText(str(tiny.copy))
    with qtbot.waitSignal(window.service.pair_loaded, timeout=30_000):
        qtbot.mouseClick(window.model_bar.load_button, Qt.MouseButton.LeftButton)
    window.composer.editor.setPlainText("Is this private?")
    streamed: list[str] = []
    window.service.tokens_generated.connect(lambda b: streamed.append(b.text))
    with qtbot.waitSignal(window.service.generation_finished, timeout=30_000) as blocker:
        qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
    [conversation] = window.store.conversations()
    user, reply = window.store.messages(conversation.id)
    assert user.content == "Is this private?"
    assert reply.content == "".join(streamed) != ""
    assert reply.origins == blocker.args[0].finished.origins
    assert reply.stats is not None and reply.stats.tokens > 0
    assert not window.error_banner.isVisible()
    assert no_network == []


def _files(*roots: Path) -> Iterator[Path]:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                yield path


def test_the_hub_token_is_in_no_log_and_no_data_file(
    qtbot: QtBot, make_window, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.hub.downloads

    previous = keyring.get_keyring()
    memory = MemoryKeyring()
    keyring.set_keyring(memory)
    log_file = logs.setup_logging(tmp_path / "logs", debug=True)  # the most that is ever logged
    try:
        window = make_window(EngineWorker(load=_fake_load, stream=_scripted(5)))
        # The token is saved as a user would, from the Models window.
        dialog = window.open_model_manager()
        dialog.hub_panel.token_edit.setText(TOKEN)
        qtbot.mouseClick(dialog.hub_panel.token_button, Qt.MouseButton.LeftButton)
        assert memory.store == {("Tandem", "huggingface"): TOKEN}

        # A download fails with an error that quotes the token.
        def refused(repo_id: str, _models_dir: Path, *, token: str | None = None, **_kw: object):
            raise RuntimeError(f"401 Unauthorized for {repo_id}: Authorization: Bearer {token}")

        monkeypatch.setattr(app.hub.downloads, "download_model", refused)
        with qtbot.waitSignal(window.hub.failed, timeout=10_000) as failed:
            dialog.hub_panel.start_task("download", "mlx-community/private-model")
        shown = (
            "Failed: 401 Unauthorized for mlx-community/private-model: Authorization: Bearer ***"
        )
        assert failed.args[0].message == shown == dialog.hub_panel.progress_label.text()
        logging.getLogger("app.test").error("the Hub refused %s", TOKEN)

        # A chat, so the database and settings are written too.
        window.model_bar.target_edit.setText("/models/fake")
        with qtbot.waitSignal(window.service.pair_loaded, timeout=5_000):
            qtbot.mouseClick(window.model_bar.load_button, Qt.MouseButton.LeftButton)
        window.composer.editor.setPlainText("Hello")
        with qtbot.waitSignal(window.service.generation_finished, timeout=5_000):
            qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
        dialog.close()
        window.close()
        assert window.hub.shutdown()
    finally:
        logs.stop_logging()
        keyring.set_keyring(previous)

    logged = log_file.read_text(encoding="utf-8")
    # The traceback is kept; the header's whole value is hidden, not only the token.
    assert "Traceback" in logged and "Authorization: ***" in logged
    assert "the Hub refused hf_***" in logged
    searched = list(_files(tmp_path, Path(os.environ["HOME"])))
    assert log_file in searched and tmp_path / "tandem.sqlite3" in searched
    assert [p for p in searched if TOKEN.encode() in p.read_bytes()] == []
