"""The status bar's segments, each on its own."""

from __future__ import annotations

import pytest
from pytestqt.qtbot import QtBot

from app.engine.types import Stats
from app.services import LoadProgress, PairInfo
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
    # The draft (step 2 of 3) has a quarter of its bytes read: 1.25 steps of 3.
    bar.load_progress.show_progress(LoadProgress(1, 3, "Loading d", 250, 1000))
    assert bar.load_progress.value() / bar.load_progress.maximum() == pytest.approx(1.25 / 3, 0.01)
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
    bar.server.show_server("http://127.0.0.1:8080/v1", 12, 3)
    assert bar.server.text().endswith("· 12 requests · 3 in progress")
    bar.server.show_server("", 0)
    assert not bar.server.isVisible()


@pytest.mark.parametrize(
    ("progress", "text"),
    [
        (LoadProgress(0, 3, "Loading qwen-7b"), "Loading qwen-7b"),
        (LoadProgress(0, 3, "Loading qwen-7b", 0, 6_200_000_000), "Loading qwen-7b: 0 B of 6.2 GB"),
        (
            LoadProgress(0, 3, "Loading qwen-7b", 2_100_000_000, 6_200_000_000, 19.6),
            "Loading qwen-7b: 2.1 of 6.2 GB, about 20 s left",
        ),
        (
            LoadProgress(0, 1, "Loading llama-70b", 4_000_000_000, 40_000_000_000, 300.0),
            "Loading llama-70b: 4.0 of 40.0 GB, about 5 min left",
        ),
    ],
)
def test_loading_says_the_bytes_read_and_the_time_left(progress: LoadProgress, text: str) -> None:
    from app.ui.statusbar.load_progress import load_text

    assert load_text(progress) == text
