"""The local server's panel: URL, masked key with Copy Key, and the last requests."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from pytestqt.qtbot import QtBot

from app.engine.observe import BatchStats
from app.server.http import RequestLog
from app.services import EngineLoad
from app.ui.main_window import MainWindow
from app.ui.server_panel import MAX_ROWS, NO_KEY_TEXT, ServerPanel, mask_key

KEY = "tandem-secret-key-1234"
PATH = 2  # the Path column


def _panel(qtbot: QtBot) -> ServerPanel:
    panel = ServerPanel()
    qtbot.addWidget(panel)
    panel.show()
    return panel


def _shown_rows(panel: ServerPanel) -> list[list[str]]:
    model = panel.table.model()
    return [
        [model.index(r, c).data() for c in range(model.columnCount())]
        for r in range(model.rowCount())
    ]


def test_requests_are_listed_newest_first_without_the_prompt(qtbot: QtBot) -> None:
    panel = _panel(qtbot)
    panel.add_request(RequestLog("GET", "/v1/models", 200, 0.004), datetime(2025, 1, 2, 9, 5, 1))
    chat = RequestLog("POST", "/v1/chat/completions", 200, 1.25, 42, prompt="my secret question")
    panel.add_request(chat, datetime(2025, 1, 2, 9, 5, 7))
    assert _shown_rows(panel) == [
        ["09:05:07", "POST", "/v1/chat/completions", "200", "42", "1,250 ms"],
        ["09:05:01", "GET", "/v1/models", "200", "", "4 ms"],
    ]
    headers = [panel.model.headerData(c, Qt.Orientation.Horizontal) for c in range(6)]
    assert headers == ["Time", "Method", "Path", "Status", "Tokens", "Duration"]
    assert not any("secret" in str(field) for row in panel.model.rows for field in row.cells())


def test_only_the_last_requests_are_kept(qtbot: QtBot) -> None:
    panel = _panel(qtbot)
    for i in range(MAX_ROWS + 5):
        panel.add_request(RequestLog("GET", f"/v1/models?n={i}", 200, 0.001))
    rows = _shown_rows(panel)
    assert len(rows) == MAX_ROWS
    assert rows[0][2] == f"/v1/models?n={MAX_ROWS + 4}"
    assert rows[-1][2] == "/v1/models?n=5"


def test_key_is_masked_and_copy_key_puts_it_on_the_clipboard(qtbot: QtBot) -> None:
    panel = _panel(qtbot)
    panel.set_server("http://127.0.0.1:8080/v1", KEY)
    assert panel.url_label.text() == "http://127.0.0.1:8080/v1"
    assert panel.key_label.text() == "••••••••1234" == mask_key(KEY)
    assert KEY not in panel.key_label.text()
    QGuiApplication.clipboard().clear()
    qtbot.mouseClick(panel.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == KEY


def test_short_keys_show_no_characters() -> None:
    assert mask_key("abc12") == "••••••••"


def test_without_a_key_it_says_loopback_only(qtbot: QtBot) -> None:
    panel = _panel(qtbot)
    panel.set_server("http://127.0.0.1:8080/v1", KEY)
    panel.set_server("http://127.0.0.1:8080/v1", None)
    assert panel.key_label.text() == NO_KEY_TEXT == "none (loopback only)"
    assert not panel.copy_button.isEnabled()
    panel.set_server("", None)
    assert panel.url_label.text() == "not running"


def test_window_opens_the_panel_from_the_view_menu_and_fills_it(
    qtbot: QtBot, make_window: Callable[[], MainWindow]
) -> None:
    window = make_window()
    assert window.menus.server_panel_action.text() == "&Local Server…"
    assert not window.server_panel.isVisible()
    window.server._url = "http://127.0.0.1:8080/v1"
    window.server._api_key = KEY
    # What the HTTP app hands the service for each answered request.
    window.server._on_request(RequestLog("POST", "/v1/chat/completions", 200, 0.5, 7, "hi"))
    assert window.server.request_count == 1
    window.menus.server_panel_action.trigger()
    assert window.server_panel.isVisible()
    assert window.server_panel.url_label.text() == "http://127.0.0.1:8080/v1"
    assert window.server_panel.key_label.text() == mask_key(KEY)
    assert _shown_rows(window.server_panel)[0][1:] == [
        "POST",
        "/v1/chat/completions",
        "200",
        "7",
        "500 ms",
    ]


def test_clicking_the_status_label_opens_the_panel(
    qtbot: QtBot, make_window: Callable[[], MainWindow]
) -> None:
    window = make_window()
    window.server._url = "http://127.0.0.1:8080/v1"
    window.server.running_changed.emit(window.server._url)
    assert window.status.server.isVisibleTo(window)
    qtbot.mouseClick(window.status.server, Qt.MouseButton.LeftButton)
    assert window.server_panel.isVisible()
    assert window.server_panel.key_label.text() == NO_KEY_TEXT


def test_the_path_column_shows_a_chat_path_whole_and_its_tooltip_any_path(
    qtbot: QtBot,
) -> None:
    panel = _panel(qtbot)
    path = "/v1/chat/completions"
    panel.add_request(RequestLog("POST", path, 200, 1.2, 120))
    long = "/v1/" + "x" * 300
    panel.add_request(RequestLog("GET", long, 404, 0.01, 0))
    qtbot.waitExposed(panel)
    model = panel.table.model()
    metrics = panel.table.fontMetrics()
    # An item delegate pads its text by the focus frame's margin plus one, each side.
    style = panel.table.style()
    pad = style.pixelMetric(style.PixelMetric.PM_FocusFrameHMargin) + 1
    room = panel.table.columnWidth(PATH) - 2 * pad
    assert metrics.horizontalAdvance(path) <= room
    assert not panel.table.wordWrap()  # one line a request
    assert model.index(0, PATH).data(Qt.ItemDataRole.ToolTipRole) == long
    assert model.index(1, PATH).data(Qt.ItemDataRole.ToolTipRole) == path


def test_the_panel_switches_the_server_on_and_off_and_settings_remember(
    qtbot: QtBot, make_window: Callable[[], MainWindow], monkeypatch, tmp_path: Path
) -> None:
    import asyncio

    from app.server.security import ServerConfig
    from app.store import SettingsFile
    from app.ui.server_panel import START_TEXT, STOP_TEXT

    window = make_window()
    monkeypatch.setattr("app.ui.local_server.get_api_key", lambda: None)

    async def start(config: ServerConfig) -> str:  # what listening on the port would say
        window.server._url = config.url(config.port)
        window.server.running_changed.emit(window.server._url)
        return window.server._url

    async def stop() -> None:
        window.server._url = ""
        window.server.running_changed.emit("")

    monkeypatch.setattr(window.server, "start", start)
    monkeypatch.setattr(window.server, "stop", stop)
    # The app runs the switch on its qasync loop; here a plain loop runs each one.
    monkeypatch.setattr(
        window.local_server, "apply", lambda s: asyncio.run(window.local_server.apply_now(s))
    )
    window.menus.server_panel_action.trigger()
    panel = window.server_panel
    assert panel.switch_button.text() == START_TEXT == "Start Server"
    qtbot.mouseClick(panel.switch_button, Qt.MouseButton.LeftButton)
    assert panel.url_label.text() == "http://127.0.0.1:8080/v1"
    assert panel.switch_button.text() == STOP_TEXT
    saved = SettingsFile(tmp_path / "settings.json")  # the file the window was made with
    assert saved.load().server_enabled  # as if ticked in Settings
    assert window.status.server.isVisibleTo(window)
    qtbot.mouseClick(panel.switch_button, Qt.MouseButton.LeftButton)
    assert panel.url_label.text() == "not running" and panel.switch_button.text() == START_TEXT
    assert not saved.load().server_enabled


def test_a_server_that_cannot_start_says_why_in_the_panel(
    qtbot: QtBot, make_window: Callable[[], MainWindow]
) -> None:
    window = make_window()
    panel = window.open_server_panel()
    window.local_server.failed.emit("The local server did not start: address in use")
    assert panel.problem_label.isVisible()
    assert panel.problem_label.text().endswith("address in use")
    panel.set_server("http://127.0.0.1:8080/v1", None)
    assert not panel.problem_label.isVisible()


def test_the_panel_says_what_the_engine_runs_and_what_its_batch_has_done(qtbot: QtBot) -> None:
    panel = _panel(qtbot)
    assert panel.load_label.text() == "idle"
    panel.show_load(EngineLoad(active=1))
    assert panel.load_label.text() == "1 reply running"
    batch = BatchStats(active=3, rounds=1234, drafted=400, accepted=300, tokens=700, largest=4)
    panel.show_load(EngineLoad(active=3, waiting=2, batched=3, max_batch=8, batch=batch))
    assert panel.load_label.text() == (
        "3 replies running, 3 in one batch (up to 8); 2 waiting\n"
        "Shared batch so far: 1,234 rounds, up to 4 replies a round, 75% of drafts accepted"
    )
    shared = BatchStats(rounds=5, largest=2, shared=1536)
    panel.show_load(EngineLoad(active=2, batched=2, max_batch=8, batch=shared))
    assert panel.load_label.text().endswith(
        "up to 2 replies a round, 1,536 prompt tokens shared rather than read"
    )


def test_the_window_s_panel_follows_the_engine_s_load(
    qtbot: QtBot, make_window: Callable[[], MainWindow]
) -> None:
    window = make_window()
    assert window.server_panel.load_label.text() == "idle"
    window.service.load_changed.emit(EngineLoad(active=2, batched=2))
    assert window.server_panel.load_label.text() == "2 replies running, 2 in one batch (up to 8)"
