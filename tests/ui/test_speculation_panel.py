from __future__ import annotations

from pytestqt.qtbot import QtBot

from app.engine.types import DraftSetting
from app.store import Settings
from app.ui.speculation_panel import SpeculationPanel


def _panel(qtbot: QtBot, settings: Settings | None = None) -> SpeculationPanel:
    panel = SpeculationPanel(settings or Settings())
    qtbot.addWidget(panel)
    return panel


def test_k_runs_from_off_to_16_and_auto_is_the_default(qtbot: QtBot) -> None:
    panel = _panel(qtbot)
    assert (panel.k_slider.minimum(), panel.k_slider.maximum()) == (0, 16)
    assert panel.drafting().num_draft is None and panel.k_value.text() == "auto"
    long = _panel(qtbot, Settings(drafting=DraftSetting.fixed(16)))
    assert long.drafting().num_draft == 16 and long.k_value.text() == "k: 16"  # not clamped at 12
    long.set_num_draft(0)
    assert long.k_value.text() == "k: off"


def test_show_auto_k_labels_autos_choice_only_while_auto_is_on(qtbot: QtBot) -> None:
    panel = _panel(qtbot)
    with qtbot.assertNotEmitted(panel.drafting_changed):  # what is shown, not what is asked
        panel.show_auto_k(8)
    assert panel.k_value.text() == "auto: 8"
    panel.show_auto_k(None)
    assert panel.k_value.text() == "auto"
    panel.show_auto_k(12)
    panel.set_num_draft(5)
    assert panel.k_value.text() == "k: 5"
    panel.show_auto_k(9)  # a round Auto planned, still in flight as k was fixed
    assert panel.k_value.text() == "k: 5"
    with qtbot.waitSignal(panel.drafting_changed) as blocker:
        panel.auto_check.setChecked(True)
    assert blocker.args == [DraftSetting(5, auto=True)]  # the slider's k kept
    assert panel.k_value.text() == "auto"  # until Auto's next round
    panel.show_auto_k(3)
    assert panel.k_value.text() == "auto: 3"


def test_set_fixed_k_leaves_auto_on(qtbot: QtBot) -> None:
    panel = _panel(qtbot)
    panel.set_fixed_k(6)
    assert panel.drafting().num_draft is None and panel.k_slider.value() == 6
    panel.auto_check.setChecked(False)
    assert panel.drafting().num_draft == 6


def test_the_legend_names_the_pairs_drafter_only(qtbot: QtBot) -> None:
    from app.engine.live import LiveStats

    panel = _panel(qtbot)
    live = LiveStats()
    live.subscribe(panel.show_live)  # heard hidden too: the legend is the pair's
    assert "accepted&nbsp;draft" in panel.legend.text()
    assert "MTP" not in panel.legend.text()
    live.reset_pair(own_head=True)
    assert "accepted&nbsp;MTP&nbsp;draft" in panel.legend.text()
    assert "accepted&nbsp;draft" not in panel.legend.text()
    live.reset_pair()
    assert "MTP" not in panel.legend.text()
    assert "prompt&nbsp;lookup" in panel.legend.text()  # the other origins stay


def test_the_legend_lines_up_in_two_rows_at_the_panels_narrowest(qtbot: QtBot) -> None:
    from app.engine.live import LiveStats

    panel = _panel(qtbot)
    live = LiveStats()
    live.subscribe(panel.show_live)
    live.reset_pair(own_head=True)  # the longest drafter's name
    panel.resize(panel.minimumSizeHint().width(), 700)
    panel.show()
    qtbot.waitExposed(panel)
    legend = panel.legend
    line = legend.fontMetrics().lineSpacing()
    # Two rows of two, none alone on a line (a flowed legend took three rows here).
    assert legend.width() >= legend.minimumSizeHint().width()
    assert legend.heightForWidth(legend.width()) < 3 * line
