"""Tune's two charts: speed against the draft length k, and what verifying m tokens costs.

The speed chart plots measured and predicted tok/s and acceptance against k,
the best k and where Auto's k averaged out; the cost chart plots verifying m
tokens as a multiple of one plain step. The k Auto picks is marked on both.
"""

from __future__ import annotations

import math

from PySide6.QtCharts import QChart, QChartView, QLineSeries, QScatterSeries, QValueAxis
from PySide6.QtCore import QMargins, QPointF, Qt
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QHBoxLayout, QWidget

from app.engine.calibrate import CalibrationResult
from app.engine.costs import Plan

TPS_COLOR = QColor("#1f77b4")
ACCEPT_COLOR = QColor("#ff7f0e")
BEST_COLOR = QColor("#2ca02c")
AUTO_COLOR = QColor("#9467bd")
PICK_COLOR = QColor("#d62728")
COST_COLOR = QColor("#8c564b")


class TuneCharts(QWidget):
    """Tune's two charts side by side: built once, then redrawn for each result.

    The series, axes and views are attributes, so what a chart shows can be
    read from it. One widget holds both, so the PNG export shows them together.

    Args:
        k_max: The longest draft the speed chart shows before any result.
    """

    def __init__(self, k_max: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.k_max = k_max
        self._build_chart()
        self._build_cost_chart()
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.chart_view, 3)
        row.addWidget(self.cost_view, 2)

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
        # A slow pair's few tok/s need a decimal, or the ticks read 0, 1, 1, 2, 2.
        self.tps_axis.setLabelFormat("%.1f" if self.tps_axis.max() < 10 else "%.0f")

    def _set_cost_axes(self, widths: int, steps_max: float) -> None:
        widths = max(widths, 2)
        self.m_axis.setRange(0.5, widths + 0.5)
        _set_ticks(self.m_axis, 1, widths - 1)
        self.steps_axis.setRange(0, steps_max * 1.15 if steps_max > 0 else 2.0)
        self.steps_axis.applyNiceNumbers()

    def plot(self, r: CalibrationResult, plan: Plan | None) -> None:
        """Draws ``r`` on both charts; ``plan`` is the k Auto picks from it."""
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
        # No label by the point: it would cover Auto's markers; the summary gives its speed.
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
        self.pick_series.replace([] if plan is None else [QPointF(plan.k, plan.rate)])
        self.pick_series.setName("Auto" if plan is None else f"Auto picks {plan.k}")
        self.pick_series.setVisible(plan is not None)
        widths = self._show_costs(r, plan)
        k_top = max([self.k_max, *(p.k for p in r.points if p.k is not None)])
        if auto is not None and auto.mean_k is not None:
            k_top = max(k_top, math.ceil(auto.mean_k))
        k_top = max(k_top, widths - 1)
        self._set_axes(k_top, max([p.tps for p in r.points] + [p.rate for p in predicted]))
        self.chart.setTitle(f"{r.pair or 'Draft length'}: best k = {r.best_k}")

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
