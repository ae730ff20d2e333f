"""The draft-length tuner: run a calibration sweep and chart speed against k.

Two charts: measured and predicted tok/s (and acceptance) against k, and what
verifying m tokens costs as a multiple of one plain step, with the k Auto
picks from those costs marked on both. The dialog only shows and asks; the
engine thread runs :func:`app.engine.calibrate.calibrate` when
:attr:`TuneDialog.run_requested` fires and feeds the events back through the
``show_*`` slots.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import cast

from PySide6.QtCharts import QChart, QChartView, QLineSeries, QScatterSeries, QValueAxis
from PySide6.QtCore import QMargins, QPointF, Qt, Signal, Slot
from PySide6.QtGui import QColor, QPainter, QPen, QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.engine.calibrate import (
    QUICK_TOKENS,
    CalibrationProgress,
    CalibrationResult,
    SweepPlan,
    save_json,
)
from app.engine.calibrate import recent_prompts as distinct_recent
from app.engine.costs import K_MAX, Plan

RECENT, BUILTIN = "recent", "builtin"
TPS_COLOR = QColor("#1f77b4")
ACCEPT_COLOR = QColor("#ff7f0e")
BEST_COLOR = QColor("#2ca02c")
AUTO_COLOR = QColor("#9467bd")
PICK_COLOR = QColor("#d62728")
COST_COLOR = QColor("#8c564b")


# Steps of the bar per run, so it moves within a run as its tokens come.
RUN_STEPS = 100

IDLE_SUMMARY = "Run a sweep to see the speed of each draft length."
RUNNING_SUMMARY = "Sweeping: the speed of each draft length shows here when the sweep ends."


def plan_text(plan: Plan | None) -> str:
    """Why Auto picks its k, in words: "Auto picks k = 8: 9 tokens verify for 1.7 steps"."""
    if plan is None:
        return "No cost profile in this result: run the sweep again to see what Auto picks."
    why = f": {plan.reason}" if plan.steps is not None else ""
    rate = f", about {plan.rate:.0f} tok/s predicted" if plan.rate > 0 else ""
    return f"Auto picks k = {plan.k}{why}{rate}."


def duration_text(seconds: float) -> str:
    """A time estimate in words: "under a minute", "about 4 min", "about 1 h 20 min"."""
    if seconds < 60:
        return "under a minute"
    minutes = math.ceil(seconds / 60)
    if minutes < 60:
        return f"about {minutes} min"
    return f"about {minutes // 60} h {minutes % 60} min"


def _preview(prompts: list[str]) -> str:
    """The prompts as a tooltip, one short line each."""
    lines = [" ".join(p.split()) for p in prompts]
    return "\n".join(f"• {line[:80]}{'…' if len(line) > 80 else ''}" for line in lines)


class TuneDialog(QDialog):
    """Runs a sweep over the draft length k and shows tok/s, acceptance and costs per k.

    Args:
        pair_label: The loaded pair, as shown to the user.
        recent_prompts: The user's prompts, oldest first; the last few distinct
            ones make the "Recent prompts" set (offered from two on).
        builtin_prompts: The built-in set.
        k_max: Right end of the k axis.
        parent: Parent widget.
        guess_k: The k a quick sweep measures besides plain decoding and auto.
        plain_tps: The pair's plain decoding speed, for the time estimate; ``None``
            while unknown.
    """

    run_requested = Signal(object)  # SweepPlan: what to calibrate
    cancel_requested = Signal()
    best_k_chosen = Signal(int)

    def __init__(
        self,
        pair_label: str,
        recent_prompts: list[str],
        builtin_prompts: list[str],
        k_max: int = K_MAX,
        parent: QWidget | None = None,
        guess_k: int = 4,
        plain_tps: float | None = None,
    ) -> None:
        super().__init__(parent)
        self._guess_k = guess_k
        self._plain_tps = plain_tps
        self.setWindowTitle("Tune Draft Length")
        self.resize(1120, 660)
        self.k_max = max(1, k_max)
        self.calibration: CalibrationResult | None = None
        self.running = False
        self._prompts = {RECENT: distinct_recent(recent_prompts), BUILTIN: list(builtin_prompts)}

        self.pair_label = QLabel(f"<b>{pair_label}</b>")
        self.pair_label.setTextFormat(Qt.TextFormat.RichText)
        intro = QLabel(
            "Measures what verifying m tokens at once costs on this machine, then the "
            "decoding speed of each draft length k on the same prompts, and suggests the fastest."
        )
        intro.setWordWrap(True)

        self.prompt_combo = QComboBox()
        for key, name in ((RECENT, "Recent prompts"), (BUILTIN, "Built-in set")):
            items = self._prompts[key]
            self.prompt_combo.addItem(f"{name} ({len(items)})", key)
            self.prompt_combo.setItemData(
                self.prompt_combo.count() - 1, _preview(items), Qt.ItemDataRole.ToolTipRole
            )
        # One prompt says too little about a workload (calibrate.prompt_set agrees).
        usable = len(self._prompts[RECENT]) >= 2
        model = cast(QStandardItemModel, self.prompt_combo.model())
        model.item(0).setEnabled(usable)
        self.prompt_combo.setCurrentIndex(0 if usable else 1)
        self.run_button = QPushButton("Run")
        self.run_button.setDefault(True)
        self.run_button.clicked.connect(self._on_run_clicked)
        guess = SweepPlan.quick([""], guess_k).ks[1]
        self.quick_check = QCheckBox(
            f"Quick: 1 prompt, {QUICK_TOKENS} tokens, k = 0, {guess} and auto"
        )
        self.quick_check.setToolTip("For a slow machine: a rough answer in a fraction of the time")
        self.estimate = QLabel()
        self.estimate.setAccessibleName("How long the sweep takes")
        self.prompt_combo.currentIndexChanged.connect(self._on_current_index_changed)
        self.quick_check.toggled.connect(self._on_toggled)
        choose = QHBoxLayout()
        choose.addWidget(QLabel("Prompts:"))
        choose.addWidget(self.prompt_combo, 1)
        choose.addWidget(self.quick_check)
        choose.addWidget(self.run_button)

        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self._on_cancel_clicked)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        running = QHBoxLayout()
        running.addWidget(self.progress, 1)
        running.addWidget(self.cancel_button)

        self._build_chart()
        self._build_cost_chart()
        # Both charts in one widget, so the PNG export shows them side by side.
        self.charts = QWidget()
        charts = QHBoxLayout(self.charts)
        charts.setContentsMargins(0, 0, 0, 0)
        charts.addWidget(self.chart_view, 3)
        charts.addWidget(self.cost_view, 2)
        self.plan_label = QLabel("")
        self.plan_label.setWordWrap(True)
        self.plan_label.setAccessibleName("What Auto picks")
        self.plan_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.summary = QLabel(IDLE_SUMMARY)
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.use_button = QPushButton("Use Best k")
        self.use_button.clicked.connect(self._on_use_clicked)
        self.json_button = QPushButton("Export JSON…")
        self.json_button.clicked.connect(self._on_export_json_clicked)
        self.png_button = QPushButton("Export PNG…")
        self.png_button.clicked.connect(self._on_export_png_clicked)
        self.close_button = QPushButton("Close")
        self.close_button.clicked.connect(self.reject)
        buttons = QHBoxLayout()
        buttons.addWidget(self.use_button)
        buttons.addStretch(1)
        buttons.addWidget(self.json_button)
        buttons.addWidget(self.png_button)
        buttons.addWidget(self.close_button)

        layout = QVBoxLayout(self)
        layout.addWidget(self.pair_label)
        layout.addWidget(intro)
        layout.addLayout(choose)
        layout.addWidget(self.estimate)
        layout.addLayout(running)
        layout.addWidget(self.status)
        layout.addWidget(self.charts, 1)
        layout.addWidget(self.plan_label)
        layout.addWidget(self.summary)
        layout.addLayout(buttons)
        self.set_running(False)
        self._show_estimate()

    def _build_chart(self) -> None:
        self.chart = QChart()
        self.chart.setMargins(QMargins(4, 4, 4, 4))
        self.chart.legend().setAlignment(Qt.AlignmentFlag.AlignBottom)

        self.tps_series = QLineSeries()
        self.tps_series.setName("tok/s")
        self.tps_series.setPointsVisible(True)
        self.tps_series.setPen(QPen(TPS_COLOR, 2.5))
        self.acceptance_series = QLineSeries()
        self.acceptance_series.setName("acceptance %")
        self.acceptance_series.setPointsVisible(True)
        pen = QPen(ACCEPT_COLOR, 2)
        pen.setStyle(Qt.PenStyle.DashLine)
        self.acceptance_series.setPen(pen)
        self.best_series = QScatterSeries()
        self.best_series.setName("best k")
        self.best_series.setMarkerSize(16)
        self.best_series.setColor(BEST_COLOR)
        self.best_series.setBorderColor(BEST_COLOR.darker(140))
        self.best_series.setPointLabelsFormat("@yPoint tok/s")
        self.best_series.setPointLabelsColor(BEST_COLOR.darker(160))
        self.best_series.setPointLabelsVisible(True)
        self.auto_series = QScatterSeries()
        self.auto_series.setName("auto")
        self.auto_series.setMarkerShape(QScatterSeries.MarkerShape.MarkerShapeTriangle)
        self.auto_series.setMarkerSize(14)
        self.auto_series.setColor(AUTO_COLOR)
        self.auto_series.setBorderColor(AUTO_COLOR.darker(140))
        self.predicted_series = QLineSeries()
        self.predicted_series.setName("predicted")
        pen = QPen(TPS_COLOR.lighter(140), 2)
        pen.setStyle(Qt.PenStyle.DotLine)
        self.predicted_series.setPen(pen)
        self.pick_series = _pick_marker()

        self.k_axis = QValueAxis()
        self.k_axis.setTitleText("draft length k")
        self.k_axis.setLabelFormat("%d")
        self.tps_axis = QValueAxis()
        self.tps_axis.setTitleText("tok/s")
        self.tps_axis.setLabelFormat("%.0f")
        self.tps_axis.setLinePenColor(TPS_COLOR)
        self.tps_axis.setTitleBrush(TPS_COLOR)
        self.acceptance_axis = QValueAxis()
        self.acceptance_axis.setTitleText("acceptance %")
        self.acceptance_axis.setLabelFormat("%d")
        self.acceptance_axis.setRange(0, 100)
        self.acceptance_axis.setTickCount(6)
        # Its ticks rarely line up with the tok/s axis; one grid is readable, two are not.
        self.acceptance_axis.setGridLineVisible(False)
        self.acceptance_axis.setLinePenColor(ACCEPT_COLOR)
        self.acceptance_axis.setTitleBrush(ACCEPT_COLOR)
        self.chart.addAxis(self.k_axis, Qt.AlignmentFlag.AlignBottom)
        self.chart.addAxis(self.tps_axis, Qt.AlignmentFlag.AlignLeft)
        self.chart.addAxis(self.acceptance_axis, Qt.AlignmentFlag.AlignRight)
        for series, y_axis in (
            (self.tps_series, self.tps_axis),
            (self.acceptance_series, self.acceptance_axis),
            (self.predicted_series, self.tps_axis),
            (self.best_series, self.tps_axis),
            (self.auto_series, self.tps_axis),
            (self.pick_series, self.tps_axis),
        ):
            self.chart.addSeries(series)
            series.attachAxis(self.k_axis)
            series.attachAxis(y_axis)
        self._set_axes(self.k_max, 0.0)

        self.chart_view = QChartView(self.chart)
        self.chart_view.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.chart_view.setMinimumHeight(300)

    def _build_cost_chart(self) -> None:
        self.cost_chart = QChart()
        self.cost_chart.setMargins(QMargins(4, 4, 4, 4))
        self.cost_chart.legend().setAlignment(Qt.AlignmentFlag.AlignBottom)
        self.cost_chart.setTitle("Verify cost")
        self.cost_series = QLineSeries()
        self.cost_series.setName("verify m tokens")
        self.cost_series.setPointsVisible(True)
        self.cost_series.setPen(QPen(COST_COLOR, 2.5))
        self.cost_pick_series = _pick_marker()
        self.m_axis = QValueAxis()
        self.m_axis.setTitleText("tokens verified m")
        self.m_axis.setLabelFormat("%d")
        self.steps_axis = QValueAxis()
        self.steps_axis.setTitleText("cost (plain steps)")
        self.steps_axis.setLabelFormat("%.1f")
        self.cost_chart.addAxis(self.m_axis, Qt.AlignmentFlag.AlignBottom)
        self.cost_chart.addAxis(self.steps_axis, Qt.AlignmentFlag.AlignLeft)
        for series in (self.cost_series, self.cost_pick_series):
            self.cost_chart.addSeries(series)
            series.attachAxis(self.m_axis)
            series.attachAxis(self.steps_axis)
        self._set_cost_axes(self.k_max + 1, 0.0)
        self.cost_view = QChartView(self.cost_chart)
        self.cost_view.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.cost_view.setMinimumHeight(300)

    def _set_axes(self, k_max: int, tps_max: float) -> None:
        # Half a step beyond the ends, so the end points are not cut in half.
        self.k_axis.setRange(-0.5, k_max + 0.5)
        _set_ticks(self.k_axis, 0, k_max)
        top = tps_max * 1.15 if tps_max > 0 else 10.0
        self.tps_axis.setRange(0, top)
        self.tps_axis.applyNiceNumbers()

    def _set_cost_axes(self, widths: int, steps_max: float) -> None:
        widths = max(widths, 2)
        self.m_axis.setRange(0.5, widths + 0.5)
        _set_ticks(self.m_axis, 1, widths - 1)
        self.steps_axis.setRange(0, steps_max * 1.15 if steps_max > 0 else 2.0)
        self.steps_axis.applyNiceNumbers()

    def chosen_prompts(self) -> list[str]:
        """The prompts of the set chosen in the combo box."""
        return list(self._prompts[self.prompt_combo.currentData()])

    def plan(self) -> SweepPlan:
        """The sweep Run asks for: the chosen prompts, quick or full."""
        prompts = self.chosen_prompts()
        if self.quick_check.isChecked():
            return SweepPlan.quick(prompts, self._guess_k)
        return SweepPlan.full(prompts)

    def set_plain_speed(self, tps: float | None) -> None:
        """The pair's plain decoding speed, which the time estimate is made from."""
        self._plain_tps = tps
        self._show_estimate()

    @Slot(int)
    def _on_current_index_changed(self, _index: int) -> None:
        self._show_estimate()

    @Slot(bool)
    def _on_toggled(self, _on: bool) -> None:
        self._show_estimate()

    def _show_estimate(self) -> None:
        plan = self.plan()
        runs = f"{plan.runs} runs of up to {plan.max_tokens} tokens"
        seconds = plan.seconds(self._plain_tps)
        if seconds is None:
            self.estimate.setText(f"{runs}; the time shows once the first run is measured.")
        else:
            self.estimate.setText(
                f"{runs}: {duration_text(seconds)} at most, "
                f"at {self._plain_tps:.0f} tok/s plain decoding."
            )

    @Slot(bool)
    def set_running(self, running: bool) -> None:
        """Shows the progress row and locks the controls while a sweep runs."""
        self.running = running
        self.progress.setVisible(running)
        self.cancel_button.setVisible(running)
        self.cancel_button.setEnabled(running)
        self.run_button.setEnabled(not running)
        self.prompt_combo.setEnabled(not running)
        self.quick_check.setEnabled(not running)
        has = self.calibration is not None and not running
        for button in (self.use_button, self.json_button, self.png_button):
            button.setEnabled(has)
        self.summary.setText(self._footer())
        if running:
            self.progress.setRange(0, 0)  # busy until the first progress event
            self.status.setText("Starting…")

    @Slot()
    def show_cancelled(self) -> None:
        """Ends a run that stopped without a result; any earlier result stays."""
        self.set_running(False)
        kept = " The last result is still shown." if self.calibration is not None else ""
        self.status.setText(f"Sweep cancelled: nothing was measured.{kept}")

    @Slot(object)
    def show_progress(self, p: CalibrationProgress) -> None:
        """Moves the bar, within a run too; ``p.text`` says which run is next or runs."""
        within = min(p.run_done / p.run_total, 1.0) if p.run_total else 0.0
        self.progress.setRange(0, max(p.total, 1) * RUN_STEPS)
        self.progress.setValue(round((p.done + within) * RUN_STEPS))
        self.progress.setFormat(f"{p.done} of {p.total} runs")
        left = f" {duration_text(p.seconds_left)} left." if p.seconds_left is not None else ""
        if p.text == "warming up":
            self.status.setText(f"Warming up…{left}")
        elif p.text.startswith("measuring"):  # "measuring costs: …" needs no prefix
            self.status.setText(f"{p.text[:1].upper()}{p.text[1:]}…")
        else:
            tokens = f" ({p.run_done} of {p.run_total} tokens)" if p.run_done else ""
            self.status.setText(f"Measuring: {p.text}{tokens}…{left}")

    @Slot(object)
    def show_result(self, r: CalibrationResult) -> None:
        """Plots ``r`` and offers its best k."""
        self.calibration = r
        self.tps_series.replace([QPointF(p.k, p.tps) for p in r.points if p.k is not None])
        self.acceptance_series.replace(
            [
                QPointF(p.k, p.acceptance * 100)
                for p in r.points
                if p.k is not None and p.acceptance is not None
            ]
        )
        best = r.best
        self.best_series.replace([QPointF(best.k or 0, round(best.tps, 1))])
        self.best_series.setName(f"best k = {r.best_k}")
        auto = r.point(None)
        if auto is not None and auto.mean_k is not None:
            # Auto has no single k: plot it where its k averaged out.
            self.auto_series.replace([QPointF(auto.mean_k, auto.tps)])
            self.auto_series.setName(f"auto, mean k {auto.mean_k:.1f}")
        else:
            self.auto_series.clear()
            self.auto_series.setName("auto")
        self.auto_series.setVisible(auto is not None and auto.mean_k is not None)
        predicted = r.predicted()
        self.predicted_series.replace([QPointF(p.k, p.rate) for p in predicted])
        plan = r.auto_plan
        self.pick_series.replace([] if plan is None else [QPointF(plan.k, plan.rate)])
        self.pick_series.setName("Auto" if plan is None else f"Auto picks {plan.k}")
        self.pick_series.setVisible(plan is not None)
        self.plan_label.setText(plan_text(plan))
        widths = self._show_costs(r, plan)
        k_top = max([self.k_max, *(p.k for p in r.points if p.k is not None)])
        if auto is not None and auto.mean_k is not None:
            k_top = max(k_top, math.ceil(auto.mean_k))
        k_top = max(k_top, widths - 1)
        self._set_axes(k_top, max([p.tps for p in r.points] + [p.rate for p in predicted]))
        self.chart.setTitle(f"{r.pair or 'Draft length'}: best k = {r.best_k}")
        self.status.setText(
            f"Done: {len(r.points)} settings × {r.prompts} prompts, {r.max_tokens} tokens each."
        )
        self.set_running(False)

    def show_last_result(self, r: CalibrationResult) -> None:
        """Shows a stored result (the pair's last sweep) until a new one runs."""
        self.show_result(r)
        self.status.setText(
            f"Last sweep of this pair: {len(r.points)} settings × {r.prompts} prompts. "
            "Run to measure again."
        )

    def _show_costs(self, r: CalibrationResult, plan: Plan | None) -> int:
        """Plots the verify cost of m = 1 … k_max + 1; returns the widest m (0 for none)."""
        profile = r.profile
        widths = r.k_max + 1
        points = []
        if profile is not None:
            for m in range(1, widths + 1):
                steps = profile.steps(m)
                if steps is not None:
                    points.append(QPointF(m, steps))
        self.cost_series.replace(points)
        # Auto verifies its k drafts and one more token, padded to the cheapest width.
        pick = plan if plan is not None and plan.steps is not None and points else None
        if pick is None:
            self.cost_pick_series.clear()
            self.cost_pick_series.setName("Auto")
        else:
            self.cost_pick_series.replace([QPointF(pick.width, pick.steps or 0.0)])
            self.cost_pick_series.setName(f"Auto verifies {pick.width}")
        self.cost_pick_series.setVisible(pick is not None)
        self.cost_chart.setTitle(
            "Verify cost" if points else "Verify cost: not measured in this result"
        )
        self._set_cost_axes(widths, max((p.y() for p in points), default=0.0))
        return widths if points else 0

    def _footer(self) -> str:
        """The summary line: the result on show, and whether a sweep runs meanwhile."""
        if self.calibration is None:
            return RUNNING_SUMMARY if self.running else IDLE_SUMMARY
        text = self._summary(self.calibration)
        return f"Last sweep, shown until this one ends: {text}" if self.running else text

    def _summary(self, r: CalibrationResult) -> str:
        best = r.best
        parts = [f"<b>best k = {r.best_k}</b>: {best.tps:.1f} tok/s"]
        speedup = r.speedup(best)
        if speedup is not None and r.best_k != 0:
            parts.append(f"{speedup:.2f}× plain decoding")
        if best.acceptance is not None:
            parts.append(f"acceptance {best.acceptance:.0%}")
        text = ", ".join(parts)
        auto = r.point(None)
        if auto is not None:
            mean = f", mean k {auto.mean_k:.1f}" if auto.mean_k is not None else ""
            text += f"<br>auto: {auto.tps:.1f} tok/s{mean}"
        if r.best_k == 0:
            text += "<br>Drafting does not pay off on these prompts: plain decoding is fastest."
        return text

    @Slot(str)
    def show_error(self, message: str) -> None:
        """Ends the run with ``message`` in the status line."""
        self.set_running(False)
        self.status.setText(f"Calibration failed: {message}")

    def export_json(self, path: Path | str) -> None:
        """Writes the result as JSON.

        Raises:
            RuntimeError: There is no result yet.
            OSError: The file cannot be written.
        """
        if self.calibration is None:
            raise RuntimeError("no calibration result to export")
        save_json(self.calibration, path)

    def export_png(self, path: Path | str) -> bool:
        """Saves both charts as one PNG image; returns whether it was written."""
        return self.charts.grab().save(str(path), "PNG")

    @Slot()
    def _on_run_clicked(self) -> None:
        plan = self.plan()
        if not plan.prompts:
            self.status.setText("No prompts in this set.")
            return
        self.set_running(True)
        self.run_requested.emit(plan)

    @Slot()
    def _on_cancel_clicked(self) -> None:
        # The integrator calls set_running(False) once the sweep has stopped.
        self.cancel_button.setEnabled(False)
        self.status.setText("Cancelling…")
        self.cancel_requested.emit()

    @Slot()
    def _on_use_clicked(self) -> None:
        if self.calibration is not None:
            self.best_k_chosen.emit(self.calibration.best_k)
            self.accept()

    @Slot()
    def _on_export_json_clicked(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Export JSON", "calibration.json", "JSON (*.json)"
        )
        if path:
            try:
                self.export_json(path)
            except OSError as exc:
                self.status.setText(f"Could not write {path}: {exc.strerror or exc}")
            else:
                self.status.setText(f"Saved {path}")

    @Slot()
    def _on_export_png_clicked(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Export PNG", "calibration.png", "PNG image (*.png)"
        )
        if path:
            ok = self.export_png(path)
            self.status.setText(f"Saved {path}" if ok else f"Could not write {path}")

    def reject(self) -> None:
        # Escape, Close and the title bar's close button all end here; a sweep
        # left running would keep the engine busy for minutes.
        if self.running:
            self.cancel_requested.emit()
        super().reject()


def _pick_marker() -> QScatterSeries:
    """The marker of the k Auto picks, the same on both charts."""
    series = QScatterSeries()
    series.setName("Auto")
    series.setMarkerShape(QScatterSeries.MarkerShape.MarkerShapeRotatedRectangle)
    series.setMarkerSize(15)
    series.setColor(PICK_COLOR)
    series.setBorderColor(PICK_COLOR.darker(150))
    series.setVisible(False)
    return series


def _set_ticks(axis: QValueAxis, first: int, span: int) -> None:
    """A labelled tick per integer from ``first``, or per two once the labels would crowd."""
    axis.setTickType(QValueAxis.TickType.TicksDynamic)
    axis.setTickAnchor(first)
    axis.setTickInterval(1 if span <= 10 else 2)
