"""The status bar's segments, each on its own."""

from __future__ import annotations

from pytestqt.qtbot import QtBot

from app.engine.types import Stats
from app.services import PairInfo
from app.ui.statusbar import NO_PAIR, StatusBar


def test_each_segment_shows_what_it_is_told(qtbot: QtBot) -> None:
    bar = StatusBar()
    qtbot.addWidget(bar)
    bar.show()
    assert bar.pair.text() == NO_PAIR
    bar.pair.show_loading("Loading tiny")
    assert bar.pair.text() == "Loading tiny…"
    bar.pair.show_pair(PairInfo("/m/t", "/m/d", "t + d"))
    assert bar.pair.text() == "t + d"
    bar.load_progress.start()
    assert bar.load_progress.isVisible() and bar.load_progress.maximum() == 0
    bar.load_progress.show_step(2, 3)
    assert (bar.load_progress.value(), bar.load_progress.maximum()) == (2, 3)
    bar.load_progress.finish()
    assert not bar.load_progress.isVisible()
    bar.context.show_usage(900, 1000)
    assert bar.context.text() == "Context 900 / 1,000" and "#d97706" in bar.context.styleSheet()
    bar.context.show_usage(900, None)
    assert bar.context.text() == ""
    bar.show_reply_stats(Stats(tokens=10, generation_seconds=1.0))
    assert bar.speed.text() == "10.0 tok/s" and bar.acceptance.text() == "no drafting"
    bar.server.show_server("http://127.0.0.1:8080/v1", 1)
    assert bar.server.isVisible() and bar.server.text().endswith("· 1 request")
    bar.server.show_server("", 0)
    assert not bar.server.isVisible()
