"""The draft-length tuner: run a calibration sweep and chart speed against k.

Two charts: measured and predicted tok/s (and acceptance) against k, and what
verifying m tokens costs as a multiple of one plain step, with the k Auto
picks from those costs marked on both (:mod:`app.ui.tune_charts` draws them).
The dialog only shows and asks; the engine thread runs
:func:`app.engine.calibrate.calibrate` when :attr:`TuneDialog.run_requested`
fires and feeds the events back through the ``show_*`` slots.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import cast

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QStandardItemModel
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
from app.ui.tune_charts import TuneCharts

RECENT, BUILTIN = "recent", "builtin"

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
        # Verify costs a sweep measured before, which time the next one's cost measurement.
        self._verify: tuple[float | None, ...] | None = None
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
            f"Quick: 1 prompt, {QUICK_TOKENS} tokens, k = 0, {guess} and auto up to {guess}"
        )
        self.quick_check.setToolTip("For a slow machine: a rough answer in a fraction of the time")
        self.estimate = QLabel()
        self.estimate.setWordWrap(True)  # a long estimate never widens the dialog
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

        self.charts = TuneCharts(self.k_max)
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
        costs = f"verifying 1–{plan.widths} tokens ({plan.cost_passes} target passes)"
        runs = f"{plan.runs} runs of up to {plan.max_tokens} tokens"
        seconds = plan.seconds(self._plain_tps)
        cost_seconds = plan.cost_seconds(self._verify)
        if seconds is None:
            self.estimate.setText(
                f"Measures {costs}, then {runs}; the time shows once the first run is measured."
            )
        elif cost_seconds is None:  # never timed here: say so rather than leave it out
            self.estimate.setText(
                f"Measures {costs}, not yet timed on this machine, then {runs}: "
                f"{duration_text(seconds)} at most at {self._plain_tps:.1f} tok/s plain decoding."
            )
        else:
            self.estimate.setText(
                f"Measures {costs}, then {runs}: {duration_text(seconds + cost_seconds)} at "
                f"most, at {self._plain_tps:.1f} tok/s plain decoding and the last sweep's costs."
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
        if r.profile is not None:
            self._verify = r.profile.verify
            self._show_estimate()
        plan = r.auto_plan
        self.charts.plot(r, plan)
        self.plan_label.setText(plan_text(plan))
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
            auto_speedup = r.speedup(auto)
            times = f", {auto_speedup:.2f}× plain" if auto_speedup is not None else ""
            text += f"<br>auto: {auto.tps:.1f} tok/s{times}{mean}"
        if auto is not None and auto.tps > best.tps:
            text += "<br>Auto is fastest on these prompts: keep Auto on."
        elif r.best_k == 0:
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
