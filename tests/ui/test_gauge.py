import math
from array import array
from itertools import pairwise

import pytest
from PySide6.QtGui import QColor, QFontMetricsF, QImage, QPaintEvent, QPalette
from pytestqt.qtbot import QtBot

from app.engine.live import LiveSnapshot, LiveStats
from app.engine.types import RoundStat
from app.ui.gauge import (
    DRAFT_SOURCE,
    HEAD_SOURCE,
    LIFETIME_TICK,
    MAX_RADIUS,
    OVERHANG,
    PAD,
    RECENT_TICK,
    STROKE,
    GaugeWidget,
)


def _scripted(baseline_tps: float | None = 4.0) -> LiveSnapshot:
    """50% rolling and message acceptance, 55% lifetime, 5 tok/s, k 4 chosen adaptively."""
    live = LiveStats()
    live.set_lifetime(accepted=54, drafted=96)
    live.begin_message()
    live.add(
        [
            RoundStat(tokens=4, k=4, accepted=3, lookup=1, seconds=0.8, auto=True),
            RoundStat(tokens=2, k=4, accepted=1, seconds=0.4, auto=True),
        ]
        * 3,  # 18 tokens: long enough to time
        baseline_tps=baseline_tps,
    )
    return live.snapshot()


def _palette(dark: bool) -> QPalette:
    if dark:
        colors = {"Window": "#1e1e1e", "WindowText": "#ededed", "Highlight": "#3d8bfd"}
    else:
        colors = {"Window": "#f4f4f4", "WindowText": "#111111", "Highlight": "#1a63d8"}
    colors["PlaceholderText"] = "#8a8a8a"
    palette = QPalette()
    for role, color in colors.items():
        palette.setColor(getattr(QPalette.ColorRole, role), QColor(color))
    return palette


def _colors(widget: GaugeWidget) -> set[int]:
    """Distinct RGB values of the widget as painted at its size hint."""
    widget.resize(widget.sizeHint())
    image = widget.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    assert image.size() == widget.sizeHint() * widget.devicePixelRatioF()
    pixels = array("I", bytes(image.constBits()))
    return {p & 0xFFFFFF for p in pixels}


def _rgb(color: QColor) -> int:
    return color.rgb() & 0xFFFFFF


def test_summary_reads_the_figures_sent(qtbot: QtBot) -> None:
    gauge = GaugeWidget()
    qtbot.addWidget(gauge)
    gauge.set_snapshot(_scripted())
    text = (
        "Acceptance 50% this reply (recent 50%, lifetime 55%), 5.0 tok/s, 1.25× plain, "
        "k 4 (auto), 25% from prompt lookup"
    )
    assert gauge.summary() == text
    assert gauge.accessibleDescription() == text
    assert gauge.accessibleName() == "Speculation gauge"


def test_summary_without_a_baseline_is_still_measuring(qtbot: QtBot) -> None:
    gauge = GaugeWidget()
    qtbot.addWidget(gauge)
    live = LiveStats()
    live.add([RoundStat(tokens=3, k=4, accepted=2, seconds=1.0)])
    gauge.set_snapshot(live.snapshot())
    assert gauge.summary() == (
        "Acceptance 50% this reply (recent 50%, lifetime 50%), 3.0 tok/s, "
        "speedup: plain speed not measured yet, k 4"
    )


def test_empty_states(qtbot: QtBot) -> None:
    gauge = GaugeWidget()
    qtbot.addWidget(gauge)
    assert gauge.summary() == "No drafting yet"
    assert gauge.accessibleDescription() == "No drafting yet"
    live = LiveStats()
    live.set_lifetime(accepted=68, drafted=100)
    gauge.set_snapshot(live.snapshot())
    assert gauge.snapshot() is not None
    assert gauge.summary() == "No drafting yet (lifetime 68%)"
    gauge.set_snapshot(_scripted())
    gauge.set_snapshot(None)
    assert gauge.snapshot() is None
    assert gauge.accessibleDescription() == "No drafting yet"


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_paints_from_the_palette(qtbot: QtBot, dark: bool) -> None:
    gauge = GaugeWidget()
    qtbot.addWidget(gauge)
    palette = _palette(dark)
    gauge.setPalette(palette)
    gauge.set_snapshot(_scripted())
    colors = _colors(gauge)
    assert len(colors) > 2
    for role in (QPalette.ColorRole.Highlight, QPalette.ColorRole.WindowText):
        assert _rgb(palette.color(role)) in colors, role
    assert _rgb(RECENT_TICK) in colors
    assert _rgb(LIFETIME_TICK) in colors


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_empty_gauge_paints_an_unfilled_arc(qtbot: QtBot, dark: bool) -> None:
    gauge = GaugeWidget()
    qtbot.addWidget(gauge)
    palette = _palette(dark)
    gauge.setPalette(palette)
    colors = _colors(gauge)
    assert len(colors) > 2  # the track and the text are there
    assert _rgb(palette.color(QPalette.ColorRole.Highlight)) not in colors
    assert _rgb(RECENT_TICK) not in colors
    # A snapshot with nothing measured draws the same unfilled arc.
    gauge.set_snapshot(LiveStats().snapshot())
    assert _rgb(palette.color(QPalette.ColorRole.Highlight)) not in _colors(gauge)


def test_paints_at_its_minimum_size(qtbot: QtBot) -> None:
    gauge = GaugeWidget()
    qtbot.addWidget(gauge)
    gauge.set_snapshot(_scripted())
    hint, minimum = gauge.sizeHint(), gauge.minimumSizeHint()
    assert minimum.width() <= hint.width() and minimum.height() <= hint.height()
    gauge.resize(minimum)
    image = gauge.grab().toImage()
    assert not image.isNull()
    pixels = array("I", bytes(image.convertToFormat(QImage.Format.Format_RGB32).constBits()))
    assert len(set(pixels)) > 2


class _CountingGauge(GaugeWidget):
    def __init__(self) -> None:
        super().__init__()
        self.paints = 0

    def paintEvent(self, event: QPaintEvent) -> None:
        self.paints += 1
        super().paintEvent(event)


def test_set_snapshot_schedules_a_paint(qtbot: QtBot) -> None:
    gauge = _CountingGauge()
    qtbot.addWidget(gauge)
    gauge.show()
    qtbot.waitExposed(gauge)
    qtbot.waitUntil(lambda: gauge.paints > 0)
    before = gauge.paints
    gauge.set_snapshot(_scripted())
    assert gauge.paints == before  # not painted synchronously
    qtbot.waitUntil(lambda: gauge.paints > before)


def test_the_big_figure_is_this_replys_acceptance_not_the_recent_windows(qtbot: QtBot) -> None:
    # Earlier replies kept almost every drafted token; this one kept 1 of 8.
    live = LiveStats()
    live.add([RoundStat(tokens=9, k=8, accepted=8, seconds=0.1)] * 31, baseline_tps=40.0)
    live.begin_message()
    live.add([RoundStat(tokens=2, k=8, accepted=1, seconds=0.1)])
    gauge = GaugeWidget()
    qtbot.addWidget(gauge)
    palette = _palette(dark=False)
    gauge.setPalette(palette)
    gauge.set_snapshot(live.snapshot())
    assert gauge.summary().startswith("Acceptance 12% this reply (recent 97%, lifetime 97%)")
    gauge.resize(gauge.sizeHint())
    image = gauge.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    highlight = _rgb(palette.color(QPalette.ColorRole.Highlight))
    # The arc's stroke (at its size hint, the widest radius): filled near its left
    # end (12%), unfilled at its top (50%), where 97% would have filled it.
    top = PAD + OVERHANG + STROKE / 2
    cx = gauge.width() / 2
    assert image.pixel(round(cx), round(top)) & 0xFFFFFF != highlight
    r = min(gauge.width() / 2 - PAD - OVERHANG - STROKE / 2, MAX_RADIUS)
    cy = top + r
    angle = math.pi * (1 - 0.05)
    x, y = cx + r * math.cos(angle), cy - r * math.sin(angle)
    assert image.pixel(round(x), round(y)) & 0xFFFFFF == highlight


@pytest.mark.parametrize("own_head", [False, True])
def test_accepted_tokens_show_in_their_drafters_colour(qtbot: QtBot, own_head: bool) -> None:
    live = LiveStats()
    live.reset_pair(own_head=own_head)
    live.add([RoundStat(tokens=4, k=4, accepted=3, seconds=0.1)] * 6, baseline_tps=20.0)
    gauge = GaugeWidget()
    qtbot.addWidget(gauge)
    gauge.setPalette(_palette(dark=False))
    gauge.set_snapshot(live.snapshot())
    colors = _colors(gauge)
    # The target's own head is not a draft model: its share is the MTP tokens' colour.
    assert (_rgb(HEAD_SOURCE) in colors) is own_head
    assert (_rgb(DRAFT_SOURCE) in colors) is not own_head


def _first_text_rows(gauge: GaugeWidget) -> int:
    """Height in rows of the topmost text: rows holding pixels darker than the arc's track,
    up to the first gap of four blank rows."""
    image = gauge.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    track = gauge.palette().color(QPalette.ColorRole.Window).red() * 0.84
    dark = [
        y
        for y in range(image.height())
        if any((image.pixel(x, y) >> 16 & 0xFF) < track - 24 for x in range(image.width()))
    ]
    end = next((a for a, b in pairwise(dark) if b - a > 4), dark[-1])
    return end - dark[0] + 1


@pytest.mark.parametrize("text", ["No drafting yet", "Acceptance not reported"])
def test_the_empty_text_wraps_whole_inside_a_small_arc(qtbot: QtBot, text: str) -> None:
    gauge = GaugeWidget()
    qtbot.addWidget(gauge)
    gauge.setPalette(_palette(dark=False))
    gauge.empty_text = text
    line = QFontMetricsF(gauge.font()).height()
    gauge.resize(600, gauge.sizeHint().height())
    assert _first_text_rows(gauge) < line  # one line
    gauge.resize(gauge.minimumSizeHint())
    assert _first_text_rows(gauge) > line  # two lines, not one cut short
