from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage, QStandardItemModel
from pytestqt.qtbot import QtBot

from app.engine.calibrate import (
    CalibrationPoint,
    CalibrationProgress,
    CalibrationResult,
    SweepPlan,
)
from app.engine.costs import K_MAX
from app.ui.tune_dialog import RUN_STEPS, TuneDialog
from tests.fakes import BUILTIN, CUDA_STEPS, PROFILED, STEP

RECENT = ["first", "second", "first", "  ", "third"]

RESULT = CalibrationResult(
    points=(
        CalibrationPoint(0, 40.0, None, None, 640, 16.0),
        CalibrationPoint(1, 55.0, 0.9, 1.0, 640, 11.6),
        CalibrationPoint(2, 68.0, 0.85, 2.0, 640, 9.4),
        CalibrationPoint(4, 80.0, 0.8, 4.0, 640, 8.0),
        CalibrationPoint(6, 74.0, 0.72, 6.0, 640, 8.6),
        CalibrationPoint(8, 80.0, 0.65, 8.0, 640, 8.0),
        CalibrationPoint(None, 77.0, 0.78, 3.5, 640, 8.3),
    ),
    best_k=4,
    baseline_tps=40.0,
    prompts=5,
    max_tokens=128,
    pair="Qwen2.5-7B + Qwen2.5-0.5B",
)


@pytest.fixture
def dialog(qtbot: QtBot) -> TuneDialog:
    d = TuneDialog("Qwen2.5-7B + Qwen2.5-0.5B", RECENT, BUILTIN, k_max=8)
    qtbot.addWidget(d)
    d.show()
    return d


def _points(series) -> list[tuple[float, float]]:  # type: ignore[no-untyped-def]
    return [(p.x(), p.y()) for p in series.points()]


def test_result_is_charted_with_the_best_k_marked(dialog: TuneDialog) -> None:
    assert dialog.windowTitle() == "Tune Draft Length"
    assert not dialog.use_button.isEnabled()  # nothing to use before a result
    dialog.show_result(RESULT)
    assert _points(dialog.charts.tps_series) == [
        (0, 40),
        (1, 55),
        (2, 68),
        (4, 80),
        (6, 74),
        (8, 80),
    ]
    # Plain decoding drafts nothing, so acceptance starts at k = 1.
    accept = dialog.charts.acceptance_series.points()
    assert [p.x() for p in accept] == [1, 2, 4, 6, 8]
    assert [p.y() for p in accept] == pytest.approx([90, 85, 80, 72, 65])
    assert _points(dialog.charts.best_series) == [(4, 80)]
    assert dialog.charts.best_series.name() == "best k = 4"
    assert not dialog.charts.best_series.pointLabelsVisible()  # it would cover Auto's markers
    assert "80.0 tok/s" in dialog.summary.text()
    assert _points(dialog.charts.auto_series) == [(3.5, 77)]
    assert dialog.charts.auto_series.isVisible()
    assert dialog.charts.auto_series.name() == "auto, mean k 3.5"
    assert "best k = 4" in dialog.summary.text()
    assert "2.00× plain" in dialog.summary.text()
    assert "best k = 4" in dialog.charts.chart.title()
    assert (dialog.charts.k_axis.min(), dialog.charts.k_axis.max()) == (
        -0.5,
        8.5,
    )  # k = 0 … 8, whole
    assert dialog.charts.tps_axis.max() >= 80
    assert dialog.use_button.isEnabled() and dialog.png_button.isEnabled()
    # A result without a cost profile has no curve and no pick, and says so.
    assert dialog.charts.cost_series.count() == 0 and dialog.charts.predicted_series.count() == 0
    assert (
        not dialog.charts.pick_series.isVisible() and not dialog.charts.cost_pick_series.isVisible()
    )
    assert "No cost profile" in dialog.plan_label.text()
    assert "not measured" in dialog.charts.cost_chart.title()


def test_the_cost_curve_the_prediction_and_autos_pick_are_charted(qtbot: QtBot) -> None:
    d = TuneDialog(PROFILED.pair, RECENT, BUILTIN)
    qtbot.addWidget(d)
    assert d.charts.k_axis.max() == 16.5  # k runs to 16 before any result
    d.show_result(PROFILED)
    # The verify cost of m = 1 … k_max + 1 tokens, as a multiple of one plain step.
    cost = _points(d.charts.cost_series)
    assert len(cost) == K_MAX + 1 == 17
    assert [m for m, _ in cost] == list(range(1, 18))
    assert [s for _, s in cost] == pytest.approx(CUDA_STEPS)
    assert (d.charts.m_axis.min(), d.charts.m_axis.max()) == (0.5, 17.5)
    assert d.charts.steps_axis.max() >= 5.7
    # Predicted tok/s of every fixed k, next to the measured ones.
    plans = PROFILED.predicted()
    predicted = _points(d.charts.predicted_series)
    assert [k for k, _ in predicted] == list(range(1, 17))
    assert [r for _, r in predicted] == pytest.approx([p.rate for p in plans])
    assert len(_points(d.charts.tps_series)) == 12
    assert d.charts.tps_axis.max() >= max(p.rate for p in plans)
    # Auto drafts 7: 8 tokens are one tile, and cost 1.7 steps where 7 cost 5.7.
    plan = PROFILED.auto_plan
    assert plan is not None and (plan.k, plan.width) == (7, 8)
    assert _points(d.charts.pick_series) == [(7, pytest.approx(plan.rate))]
    assert d.charts.pick_series.isVisible() and d.charts.pick_series.name() == "Auto picks 7"
    assert _points(d.charts.cost_pick_series) == [(8, pytest.approx(1.7))]
    assert (
        d.charts.cost_pick_series.isVisible()
        and d.charts.cost_pick_series.name() == "Auto verifies 8"
    )
    assert d.plan_label.text().startswith("Auto picks k = 7: 8 tokens verify for 1.7 steps")
    assert f"about {plan.rate:.0f} tok/s predicted" in d.plan_label.text()
    assert d.charts.cost_chart.title() == "Verify cost"


def test_a_stored_result_is_shown_as_the_last_sweep(dialog: TuneDialog) -> None:
    dialog.show_last_result(PROFILED)
    assert dialog.calibration == PROFILED
    assert dialog.charts.cost_series.count() == K_MAX + 1
    assert dialog.status.text().startswith("Last sweep of this pair")
    assert dialog.use_button.isEnabled() and dialog.json_button.isEnabled()


def test_use_best_k_emits_it(qtbot: QtBot, dialog: TuneDialog) -> None:
    dialog.show_result(RESULT)
    with qtbot.waitSignal(dialog.best_k_chosen) as blocker:
        qtbot.mouseClick(dialog.use_button, Qt.MouseButton.LeftButton)
    assert blocker.args == [4]
    assert dialog.result() == TuneDialog.DialogCode.Accepted


def test_plain_decoding_as_best_is_said_plainly(dialog: TuneDialog) -> None:
    slow = CalibrationResult(
        (
            CalibrationPoint(0, 50.0, None, None, 10, 0.2),
            CalibrationPoint(2, 30.0, 0.2, 2, 10, 0.3),
        ),
        best_k=0,
        baseline_tps=50.0,
        prompts=2,
        max_tokens=5,
    )
    dialog.show_result(slow)
    assert _points(dialog.charts.best_series) == [(0, 50)]
    assert not dialog.charts.auto_series.isVisible()  # no auto point was measured
    assert "plain decoding is fastest" in dialog.summary.text()


def test_export_json_writes_the_result(dialog: TuneDialog, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        dialog.export_json(tmp_path / "none.json")
    dialog.show_result(RESULT)
    path = tmp_path / "calibration.json"
    dialog.export_json(path)
    data = json.loads(path.read_text())
    assert data["best_k"] == 4
    assert data["pair"] == RESULT.pair
    assert [p["label"] for p in data["points"]][-1] == "auto"
    assert CalibrationResult.from_dict(data) == RESULT
    # The cost profile travels with the export.
    dialog.show_result(PROFILED)
    dialog.export_json(path)
    data = json.loads(path.read_text())
    assert data["profile"]["verify"] == pytest.approx([s * STEP for s in CUDA_STEPS])
    assert data["k_max"] == 16 and len(data["accept"]) == 16
    assert CalibrationResult.from_dict(data) == PROFILED


def test_export_png_writes_an_image(dialog: TuneDialog, tmp_path: Path) -> None:
    dialog.show_result(PROFILED)
    path = tmp_path / "chart.png"
    assert dialog.export_png(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = QImage(str(path))
    # Both charts, side by side.
    assert image.width() >= dialog.charts.chart_view.width() + dialog.charts.cost_view.width()
    assert image.height() > 100


def test_run_emits_the_chosen_prompts(qtbot: QtBot, dialog: TuneDialog) -> None:
    assert dialog.prompt_combo.currentData() == "recent"
    with qtbot.waitSignal(dialog.run_requested) as blocker:
        qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    # Distinct, non-blank, oldest first.
    assert blocker.args == [SweepPlan.full(["second", "first", "third"])]
    assert dialog.running and not dialog.run_button.isEnabled()
    assert dialog.progress.isVisible() and dialog.cancel_button.isVisible()

    dialog.set_running(False)
    dialog.prompt_combo.setCurrentIndex(1)
    with qtbot.waitSignal(dialog.run_requested) as blocker:
        qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    assert blocker.args == [SweepPlan.full(BUILTIN)]


def test_too_few_recent_prompts_selects_the_built_in_set(qtbot: QtBot) -> None:
    d = TuneDialog("pair", ["only", "only"], BUILTIN)
    qtbot.addWidget(d)
    assert d.prompt_combo.currentData() == "builtin"
    assert d.chosen_prompts() == BUILTIN
    model = d.prompt_combo.model()
    assert isinstance(model, QStandardItemModel)
    assert not model.item(0).isEnabled()


def test_progress_moves_the_bar(dialog: TuneDialog) -> None:
    dialog.set_running(True)
    dialog.show_progress(CalibrationProgress(0, 20, "measuring costs: verifying 3 tokens"))
    assert dialog.status.text() == "Measuring costs: verifying 3 tokens…"
    dialog.show_progress(CalibrationProgress(0, 20, "warming up"))
    assert dialog.status.text() == "Warming up…"
    dialog.show_progress(CalibrationProgress(6, 20, "k = 2, prompt 2 of 5"))
    assert dialog.progress.maximum() == 20 * RUN_STEPS
    assert dialog.progress.value() == 6 * RUN_STEPS
    assert "k = 2, prompt 2 of 5" in dialog.status.text()
    dialog.show_result(RESULT)
    assert not dialog.running
    assert not dialog.progress.isVisible() and not dialog.cancel_button.isVisible()


def test_cancel_emits_and_closing_mid_run_cancels(qtbot: QtBot, dialog: TuneDialog) -> None:
    dialog.set_running(True)
    with qtbot.waitSignal(dialog.cancel_requested):
        qtbot.mouseClick(dialog.cancel_button, Qt.MouseButton.LeftButton)
    assert dialog.status.text() == "Cancelling…"
    assert not dialog.cancel_button.isEnabled()  # one request is enough
    with qtbot.waitSignal(dialog.cancel_requested):
        dialog.close()
    assert not dialog.isVisible()


def test_closing_when_idle_does_not_cancel(qtbot: QtBot, dialog: TuneDialog) -> None:
    with qtbot.assertNotEmitted(dialog.cancel_requested):
        dialog.close()
    assert not dialog.isVisible()


def test_error_ends_the_run(dialog: TuneDialog) -> None:
    dialog.set_running(True)
    dialog.show_error("out of memory")
    assert not dialog.running and dialog.run_button.isEnabled()
    assert dialog.status.text() == "Calibration failed: out of memory"


def test_the_footer_says_a_sweep_runs_while_it_runs(qtbot: QtBot, dialog: TuneDialog) -> None:
    assert dialog.summary.text() == "Run a sweep to see the speed of each draft length."
    with qtbot.waitSignal(dialog.run_requested):
        qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    assert dialog.summary.text().startswith("Sweeping: the speed of each draft length shows")
    dialog.show_result(RESULT)
    assert dialog.summary.text().startswith("<b>best k = 4</b>")
    # Another run: the result on show is said to be the last sweep's until this one ends.
    qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    assert dialog.summary.text().startswith("Last sweep, shown until this one ends: <b>best k")
    dialog.show_cancelled()
    assert dialog.summary.text().startswith("<b>best k = 4</b>")


def test_quick_mode_runs_one_prompt_short_with_three_settings(
    qtbot: QtBot, dialog: TuneDialog
) -> None:
    assert dialog.quick_check.text() == "Quick: 1 prompt, 24 tokens, k = 0, 4 and auto up to 4"
    dialog.quick_check.setChecked(True)
    with qtbot.waitSignal(dialog.run_requested) as blocker:
        qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    assert blocker.args == [SweepPlan(("second",), (0, 4, None), 24)]
    assert not dialog.quick_check.isEnabled()  # locked while it runs


def test_the_estimate_follows_the_plain_speed_and_the_mode(qtbot: QtBot) -> None:
    d = TuneDialog("pair", RECENT, BUILTIN, plain_tps=10.0, guess_k=6)
    qtbot.addWidget(d)
    full = SweepPlan.full(d.chosen_prompts())
    # Every run decoded plain, warm-up included: the longest it should take.
    assert full.seconds(10.0) == (full.runs * 64 + len(full.ks) * 8) / 10.0
    # The cost measurement comes first: never timed here yet, it is said, not left out.
    assert d.estimate.text() == (
        "Measures verifying 1–17 tokens (66 target passes), not yet timed on this machine, "
        f"then {full.runs} runs of up to 64 tokens: about 5 min at most at 10.0 tok/s plain "
        "decoding."
    )
    d.quick_check.setChecked(True)
    assert d.estimate.text() == (
        "Measures verifying 1–7 tokens (36 target passes), not yet timed on this machine, "
        "then 3 runs of up to 24 tokens: under a minute at most at 10.0 tok/s plain decoding."
    )
    # Once a sweep measured the costs, they count: 18 queued plain steps, then 3 passes of
    # each wider width at its cost.
    d.show_result(PROFILED)
    quick = SweepPlan.quick(d.chosen_prompts(), 6)
    profile = PROFILED.profile
    assert profile is not None
    costs = 18 * (profile.verify[0] or 0.0) + 3 * sum(v or 0.0 for v in profile.verify[1:7])
    assert quick.cost_seconds(profile.verify) == pytest.approx(costs)
    assert d.estimate.text().startswith("Measures verifying 1–7 tokens (36 target passes), then")
    assert d.estimate.text().endswith("at 10.0 tok/s plain decoding and the last sweep's costs.")
    d.set_plain_speed(None)
    assert d.estimate.text().endswith("the time shows once the first run is measured.")


def test_the_verdict_names_auto_when_it_beats_every_fixed_k(qtbot: QtBot) -> None:
    from dataclasses import replace

    d = TuneDialog("pair", RECENT, BUILTIN)
    qtbot.addWidget(d)
    # Quick on a slow pair: k = 0 beat k = 4, but Auto beat both (1.2 against 0.9 tok/s).
    points = (
        CalibrationPoint(0, 0.9, None, None, 24, 27.0),
        CalibrationPoint(4, 0.8, 0.6, 4.0, 24, 30.0),
        CalibrationPoint(None, 1.2, 0.8, 2.0, 24, 20.0),
    )
    slow = replace(PROFILED, points=points, best_k=0, baseline_tps=0.9, k_max=4, profile=None)
    d.show_result(slow)
    assert "Auto is fastest on these prompts: keep Auto on." in d.summary.text()
    assert "does not pay off" not in d.summary.text()
    assert "auto: 1.2 tok/s, 1.33× plain" in d.summary.text()
    # The tok/s axis of a slow pair reads with a decimal, not 0, 1, 1, 2, 2.
    assert d.charts.tps_axis.labelFormat() == "%.1f"


def test_progress_moves_within_a_run_and_says_the_time_left(dialog: TuneDialog) -> None:
    dialog.set_running(True)
    dialog.show_progress(CalibrationProgress(6, 20, "k = 2, prompt 2 of 5", 16, 64, 150.0))
    assert dialog.progress.value() == 6 * RUN_STEPS + RUN_STEPS // 4
    assert dialog.status.text() == (
        "Measuring: k = 2, prompt 2 of 5 (16 of 64 tokens)… about 3 min left."
    )
