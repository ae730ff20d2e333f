"""Tune…: the window's draft-length sweep, from its dialog to the engine and back."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QWidget

from app.engine.calibrate import SWEEP_KS as TUNE_KS
from app.engine.calibrate import SweepPlan
from app.services import CalibrationHandle, EngineFailure, EngineService, PairInfo
from app.store import Store
from app.store.calibrations import CalibrationsFile

log = logging.getLogger(__name__)

__all__ = ["TUNE_KS", "TuneFlow"]


class TuneFlow(QObject):
    """Runs the window's calibration and remembers each pair's last sweep.

    Signals:
        busy_changed: Whether a sweep runs (the composer waits meanwhile).
        best_k_found: The best fixed k the user chose to use (Use Best k), for the
            loaded pair; a sweep alone changes no setting.
    """

    busy_changed = Signal(bool)
    best_k_found = Signal(int)

    def __init__(
        self, service: EngineService, store: Store, calibrations: Path, parent: QObject
    ) -> None:
        super().__init__(parent)
        self._service = service
        self._store = store
        self._calibrations = CalibrationsFile(calibrations)
        self._pair: PairInfo | None = None
        self._calibration: CalibrationHandle | None = None
        self.dialog: Any = None
        service.calibration_progressed.connect(self._on_calibration_progressed)
        service.calibration_finished.connect(self._on_calibration_finished)
        service.failed.connect(self._on_failed)

    def set_pair(self, pair: PairInfo | None) -> None:
        """The pair a sweep measures; ``None`` once none is loaded."""
        self._pair = pair

    def open(self, parent: QWidget, guess_k: int = 4, plain_tps: float | None = None) -> Any:
        """Opens the dialog for the loaded pair, with its last sweep if there was one.

        Args:
            parent: The window the dialog sheets over.
            guess_k: The k a quick sweep measures besides plain and auto.
            plain_tps: The pair's plain decoding speed, when a reply measured it;
                else the last sweep's gives the time estimate.
        """
        from app.engine.calibrate import default_prompts
        from app.ui.tune_dialog import TuneDialog

        assert self._pair is not None
        last = self._calibrations.get(self._pair.target, self._pair.draft)
        dialog = TuneDialog(
            self._pair.label,
            self._store.recent_prompts(),
            default_prompts(),
            parent=parent,
            guess_k=guess_k,
            plain_tps=plain_tps or (last.baseline_tps if last is not None else None),
        )
        dialog.run_requested.connect(self._on_run_requested)
        dialog.best_k_chosen.connect(self.best_k_found)
        dialog.cancel_requested.connect(self.cancel)
        if last is not None:
            dialog.show_last_result(last)
        self.dialog = dialog
        dialog.open()
        return dialog

    @Slot()
    def cancel(self) -> None:
        """Stops the sweep within one step; it ends without a result."""
        if self._calibration is not None:
            self._calibration.cancel()

    @Slot(object)
    def _on_run_requested(self, plan: SweepPlan) -> None:
        if self._service.busy:
            self.dialog.show_error("Wait for the reply to finish, or stop it, then run.")
            return
        self.busy_changed.emit(True)
        self._calibration = self._service.calibrate(
            plan.prompts, plan.ks, max_tokens=plan.max_tokens
        )

    @Slot(object)
    def _on_calibration_progressed(self, progress: Any) -> None:
        if self.dialog is not None:
            self.dialog.show_progress(progress)

    @Slot(object)
    def _on_calibration_finished(self, result: Any) -> None:
        self._calibration = None
        self.busy_changed.emit(False)
        if self.dialog is not None:
            if result is None:  # cancelled, from the dialog or by Stop
                self.dialog.show_cancelled()
            else:
                self.dialog.show_result(result)
        if result is not None and self._pair is not None:
            try:  # shown again the next time Tune… opens for this pair
                self._calibrations.put(self._pair.target, self._pair.draft, result)
            except OSError as exc:
                log.warning("cannot save the calibration: %s", exc)

    @Slot(object)
    def _on_failed(self, failure: EngineFailure) -> None:
        if failure.stage != "calibrate" or self._calibration is None:
            return
        if failure.request_id != self._calibration.request_id:
            return
        self._calibration = None
        if self.dialog is not None:
            self.dialog.show_error(failure.message)
        self.busy_changed.emit(False)
