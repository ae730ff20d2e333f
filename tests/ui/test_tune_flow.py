"""Tune…'s flow between its dialog and the engine, with a stand-in engine service."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QWidget
from pytestqt.qtbot import QtBot

from app.services import PairInfo
from app.ui.tune_flow import TuneFlow


class _Handle:
    request_id = 1

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Service(QObject):
    """Takes a sweep and ends it when the test says, as the engine thread would."""

    calibration_progressed = Signal(object)
    calibration_finished = Signal(object)
    failed = Signal(object)
    busy = False

    def __init__(self) -> None:
        super().__init__()
        self.handle = _Handle()

    def calibrate(self, prompts, ks, max_tokens=64) -> _Handle:  # type: ignore[no-untyped-def]
        self.asked = (tuple(prompts), tuple(ks), max_tokens)
        return self.handle


class _Store:
    def recent_prompts(self) -> list[str]:
        return []


def test_a_cancelled_sweep_says_so_beside_an_enabled_run(qtbot: QtBot, tmp_path: Path) -> None:
    service = _Service()
    parent = QWidget()
    qtbot.addWidget(parent)
    flow = TuneFlow(service, _Store(), tmp_path / "calibrations.json", parent)  # type: ignore[arg-type]
    flow.set_pair(PairInfo("/m/target", "/m/draft", "target + draft"))
    dialog = flow.open(parent)
    qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    assert dialog.running and not dialog.run_button.isEnabled()
    qtbot.mouseClick(dialog.cancel_button, Qt.MouseButton.LeftButton)
    assert service.handle.cancelled and dialog.status.text() == "Cancelling…"
    service.calibration_finished.emit(None)  # the sweep stopped, with no result
    assert dialog.run_button.isEnabled() and not dialog.cancel_button.isVisible()
    assert dialog.status.text() == "Sweep cancelled: nothing was measured."
    assert dialog.summary.text() == "Run a sweep to see the speed of each draft length."
    dialog.close()


def test_a_quick_sweep_asks_the_engine_for_its_short_plan_with_the_guessed_k(
    qtbot: QtBot, tmp_path: Path
) -> None:
    service = _Service()
    parent = QWidget()
    qtbot.addWidget(parent)
    flow = TuneFlow(service, _Store(), tmp_path / "calibrations.json", parent)  # type: ignore[arg-type]
    flow.set_pair(PairInfo("/m/target", "/m/draft", "target + draft"))
    dialog = flow.open(parent, guess_k=5, plain_tps=20.0)
    assert "at 20.0 tok/s plain decoding" in dialog.estimate.text()
    dialog.quick_check.setChecked(True)
    qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    prompt = dialog.chosen_prompts()[0]
    assert service.asked == ((prompt,), (0, 5, None), 24)
    dialog.close()
