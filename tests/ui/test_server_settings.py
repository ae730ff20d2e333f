"""The "Local server" settings group and the window's server status."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import keyring
import pytest
from keyring.backend import KeyringBackend
from PySide6.QtWidgets import QDialogButtonBox
from pytestqt.qtbot import QtBot

from app.server import api_key
from app.store import Settings
from app.ui.main_window import MainWindow
from app.ui.settings_dialog import SettingsDialog


class MemoryKeyring(KeyringBackend):
    priority = -5  # never chosen by keyring itself

    def __init__(self) -> None:
        super().__init__()
        self.items: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.items.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.items[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        del self.items[(service, username)]


@pytest.fixture
def memory_keyring(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryKeyring]:
    backend = MemoryKeyring()
    previous = keyring.get_keyring()
    keyring.set_keyring(backend)
    monkeypatch.setattr(api_key, "key_storage_status", lambda: None)
    yield backend
    keyring.set_keyring(previous)


def _dialog(qtbot: QtBot, tmp_path: Path, settings: Settings | None = None) -> SettingsDialog:
    dialog = SettingsDialog(settings or Settings(), tmp_path)
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog


def _click_ok(dialog: SettingsDialog) -> None:
    """Clicks the dialog's OK button."""
    box = dialog.findChild(QDialogButtonBox)
    assert box is not None
    box.button(QDialogButtonBox.StandardButton.Ok).click()


def test_server_is_off_by_default(qtbot: QtBot, tmp_path: Path) -> None:
    dialog = _dialog(qtbot, tmp_path)
    assert not dialog.server_check.isChecked()
    assert (dialog.server_host.text(), dialog.server_port.value()) == ("127.0.0.1", 8080)


def test_server_fields_come_back_and_the_key_goes_to_the_keychain(
    qtbot: QtBot, tmp_path: Path, memory_keyring: MemoryKeyring
) -> None:
    dialog = _dialog(qtbot, tmp_path)
    assert dialog.server_key.isEnabled()
    dialog.server_check.setChecked(True)
    dialog.server_host.setText("0.0.0.0")
    dialog.server_port.setValue(9001)
    dialog.server_key.setText("sekret")  # too short to guard a server beyond this Mac
    with qtbot.assertNotEmitted(dialog.settings_changed):
        _click_ok(dialog)
    assert "16 characters" in dialog.error_label.text()
    dialog.server_key.setText("sekret-sekret-sekret")
    with qtbot.waitSignal(dialog.settings_changed) as blocker:
        _click_ok(dialog)
    s: Settings = blocker.args[0]
    assert (s.server_enabled, s.server_host, s.server_port) == (True, "0.0.0.0", 9001)
    assert memory_keyring.items == {("Tandem", "server-api-key"): "sekret-sekret-sekret"}
    assert api_key.get_api_key() == "sekret-sekret-sekret"


def test_non_loopback_without_a_key_is_refused(
    qtbot: QtBot, tmp_path: Path, memory_keyring: MemoryKeyring
) -> None:
    dialog = _dialog(qtbot, tmp_path)
    dialog.server_check.setChecked(True)
    dialog.server_host.setText("192.168.1.5")
    with qtbot.assertNotEmitted(dialog.settings_changed):
        _click_ok(dialog)
    assert "set an API key" in dialog.error_label.text()
    assert memory_keyring.items == {}


def test_without_a_keychain_the_key_field_explains(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.ui.settings_dialog as module

    monkeypatch.setattr(module, "key_storage_status", lambda: "no keychain backend")
    dialog = _dialog(qtbot, tmp_path)
    assert not dialog.server_key.isEnabled()
    assert "127.0.0.1 only" in dialog.key_note.text()


def test_status_bar_shows_the_url_and_request_count(make_window: Callable[[], MainWindow]) -> None:
    window = make_window()
    assert not window.status.server.isVisibleTo(window)
    window.server._url = "http://127.0.0.1:8080/v1"
    window.server.request_count = 2
    window.server.requests_changed.emit(2)
    assert window.status.server.isVisibleTo(window)
    assert window.status.server.text() == "Serving http://127.0.0.1:8080/v1 · 2 requests"
    window.server._url = ""
    window.server.running_changed.emit("")
    assert not window.status.server.isVisibleTo(window)


def test_web_origins_are_kept_and_a_wildcard_is_refused(
    qtbot: QtBot, tmp_path: Path, memory_keyring: MemoryKeyring
) -> None:
    dialog = _dialog(qtbot, tmp_path)
    dialog.server_check.setChecked(True)
    dialog.server_origins.setText(" https://app.example ,, http://localhost:5173 ")
    with qtbot.waitSignal(dialog.settings_changed) as blocker:
        _click_ok(dialog)
    assert blocker.args[0].server_cors_origins == "https://app.example, http://localhost:5173"
    again = _dialog(qtbot, tmp_path, blocker.args[0])
    again.server_origins.setText("*")
    with qtbot.assertNotEmitted(again.settings_changed):
        _click_ok(again)
    assert "must be a full origin" in again.error_label.text()


def test_the_window_starts_the_server_with_the_web_origins(
    qtbot: QtBot,
    make_window: Callable[[], MainWindow],
    memory_keyring: MemoryKeyring,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.server.security import ServerConfig

    window = make_window()
    started: list[ServerConfig] = []

    async def start(config: ServerConfig) -> str:
        started.append(config)
        return ""  # the real start returns its URL; apply_now does not use it

    import asyncio

    window.server.start = start  # type: ignore[method-assign]
    # The app runs this on its qasync loop; here a plain loop runs it once.
    monkeypatch.setattr(
        window.local_server, "apply", lambda s: asyncio.run(window.local_server.apply_now(s))
    )
    dialog = window.open_settings()
    dialog.server_check.setChecked(True)
    dialog.server_origins.setText("https://app.example")
    _click_ok(dialog)
    assert started[0].cors_origins == ("https://app.example",)
    assert started[0].host == "127.0.0.1"
