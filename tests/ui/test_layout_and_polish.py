"""The window keeps the width it is given, the server panel's columns fit their cells,
the System Prompt dialog wraps, and Linux gets its own words for macOS conventions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QInputDialog, QMenu, QPlainTextEdit
from pytestqt.qtbot import QtBot

from app.engine.types import Stats
from app.hub import catalog, fit
from app.server.http import RequestLog
from app.services import PairInfo
from app.store import Settings
from app.ui.server_panel import ServerPanel
from app.ui.settings_dialog import SettingsDialog

GB = 1000**3
GB = 1000**3
LONG_URL = "http://my-workstation.example.internal:18642/v1"


def test_the_server_segment_never_widens_the_window(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window()
    window.onboarding_flow.close()  # the chat, whose own minimum is narrower
    window.resize(1100, 720)
    bar = window.status
    bar.pair.show_pair(PairInfo("/m/t", "/m/d", "Qwen2.5-Coder-7B-Instruct-4bit + Qwen2.5-0.5B"))
    bar.context.show_usage(12_000, 32_768)
    bar.show_reply_stats(Stats(tokens=100, drafted=80, accepted=60, k_min=2, k_max=6))
    bar.server.show_server(LONG_URL, 123_456, 7)
    QApplication.processEvents()
    assert window.minimumSizeHint().width() <= 1100
    assert window.width() == 1100
    # Squeezed, a segment keeps its whole text for its tooltip and accessibility.
    window.resize(800, 720)
    QApplication.processEvents()
    assert window.width() == 800
    assert bar.server.text() == f"Serving {LONG_URL} · 123456 requests · 7 in progress"
    assert any(s.is_elided() for s in (bar.pair, bar.server, bar.acceptance))


def test_time_and_duration_columns_fit_rows_added_while_the_panel_is_open(
    qtbot: QtBot,
) -> None:
    panel = ServerPanel()
    qtbot.addWidget(panel)
    panel.set_server("http://127.0.0.1:8642/v1", None)
    panel.show()
    QApplication.processEvents()
    panel.add_request(RequestLog("POST", "/v1/chat/completions", 200, 16.25, 42))
    QApplication.processEvents()
    header = panel.table.horizontalHeader()
    for column in (0, 5):  # Time, Duration: "00:02:31", "16,250 ms"
        assert header.sectionSize(column) >= panel.table.sizeHintForColumn(column), column


def test_the_system_prompt_editor_wraps_long_text(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window()
    actions = {a.text(): a for a in window.menus.chat_actions}
    blocking = [True]

    def close_a_blocking_dialog() -> None:  # a dialog run by exec() would hang the test
        modal = QApplication.activeModalWidget()
        if blocking[0] and modal is not None:
            modal.close()

    QTimer.singleShot(0, close_a_blocking_dialog)
    actions["S&ystem Prompt…"].trigger()  # opens the dialog and returns
    blocking[0] = False
    dialog = window.findChild(QInputDialog)
    assert dialog is not None and dialog.isVisible()
    prompt = "Answer briefly, " * 40
    dialog.setTextValue(prompt)
    editor = dialog.findChild(QPlainTextEdit)
    QApplication.processEvents()
    assert editor.lineWrapMode() == QPlainTextEdit.LineWrapMode.WidgetWidth
    assert editor.horizontalScrollBar().maximum() == 0  # it wraps, never scrolls sideways
    dialog.accept()
    [conversation] = window.store.conversations()
    assert conversation.system_prompt == prompt.strip()


def test_mlx_on_a_cpu_is_offered_the_float32_demo_pair_not_a_4bit_one(
    qtbot: QtBot, make_window, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(fit, "usable_memory_bytes", lambda total=None, **_: 32 * GB)
    monkeypatch.setattr(catalog, "mlx_runs_on_gpu", lambda: False)
    from tests.ui.conftest import FakeHub

    window = make_window()
    view = window.onboarding
    assert view is not None and view.pair == catalog.DEMO
    assert "float32" in view.pair_title.text()
    assert "qwen2.5-coder-1.5b-instruct" in view.pair_detail.text()
    assert view.command_label.isVisible() and view.command_label.text() == "tandem models demo"
    view.copy_command_button.click()
    assert QGuiApplication.clipboard().text() == "tandem models demo"
    # One click installs it, as the command does, on the hub's thread.
    hub = FakeHub()
    window.pair_loading.set_hub(hub)  # type: ignore[arg-type]
    assert view.download_button.isVisible() and view.download_button.text() == "Install Both"
    view.download_button.click()
    assert hub.started == [("demo", catalog.DEMO.target, None), ("demo", catalog.DEMO.draft, None)]


def test_mlx_on_a_gpu_keeps_the_hub_pairs() -> None:
    pairs = catalog.load_catalog()
    assert catalog.recommend_for_machine(pairs, 32 * GB, gpu=True) == catalog.recommend(
        pairs, 32 * GB
    )
    assert catalog.recommend_for_machine(pairs, 32 * GB, gpu=False) == catalog.DEMO
    assert catalog.recommend_for_machine(pairs, 8 * GB, gpu=False) is None  # too small for it


@pytest.mark.parametrize(("platform", "mac"), [("linux", False), ("darwin", True)])
def test_macos_conventions_stay_on_macos(
    qtbot: QtBot,
    make_window,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    platform: str,
    mac: bool,
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(sys, "platform", platform)
    window = make_window()
    [window_menu] = [m for m in window.menuBar().findChildren(QMenu) if m.title() == "&Window"]
    texts = [a.text() for a in window_menu.actions()]
    assert ("&Zoom" in texts) is mac and "&Minimize" in texts
    dialog = SettingsDialog(Settings(), tmp_path)
    qtbot.addWidget(dialog)
    assert dialog.reveal_button.text() == ("Reveal in Finder" if mac else "Open Folder")


def test_the_sources_bar_paints_the_transcripts_token_colours(qtbot: QtBot) -> None:
    from app.engine.live import LiveStats
    from app.engine.types import Origin, RoundStat
    from app.ui.gauge import GaugeWidget
    from app.ui.transcript_style import ORIGIN_COLORS

    live = LiveStats()
    live.begin_message()
    live.add([RoundStat(tokens=4, k=4, accepted=3, lookup=1, seconds=0.8)])
    gauge = GaugeWidget()
    qtbot.addWidget(gauge)
    gauge.resize(280, 420)
    gauge.set_snapshot(live.snapshot())
    image = gauge.grab().toImage()
    painted = {image.pixel(x, y) for x in range(image.width()) for y in range(image.height())}
    for origin in (Origin.DRAFT, Origin.LOOKUP):  # green and blue, as behind the tokens
        assert ORIGIN_COLORS[origin].rgb() in painted, origin


def test_a_code_block_shows_as_code_while_it_streams(qtbot: QtBot) -> None:
    from app.engine.types import Origin
    from app.ui.transcript import TranscriptView

    view = TranscriptView()
    qtbot.addWidget(view)
    view.resize(640, 400)
    view.begin_reply()
    for text in ("Here it is:\n\n", "```python\n", "def add(a, b):\n", "    return a + b\n"):
        view.append_segments([(Origin.DRAFT, text)])
        assert "```" not in view.toPlainText()  # the fence is closed virtually
    assert view.code_blocks == ("def add(a, b):\n    return a + b",)  # once, not per line
    view.append_segments([(Origin.DRAFT, "```\n\nDone")])
    assert view.code_blocks == ("def add(a, b):\n    return a + b",)
    assert "```" not in view.toPlainText() and view.toPlainText().endswith("Done")
    view.end_reply()
    assert view.code_blocks == ("def add(a, b):\n    return a + b",)
