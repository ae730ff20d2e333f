"""The model library is scanned off the GUI thread; the window answers from the last scan."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.hub import ModelInfo, library
from app.services import LibraryScan, LibraryScanner
from app.ui.model_manager import SCANNING_HINT, ModelManagerDialog
from tests.conftest import TinyModels

real_scan = library.scan_library


class Gate:
    """A scan_library that waits for the test, then scans, noting the threads it ran on."""

    def __init__(self, scan: Callable[..., list[ModelInfo]] = real_scan) -> None:
        self.open = threading.Event()
        self.threads: list[threading.Thread] = []
        self.calls = 0
        self._scan = scan

    def __call__(self, models_dir: Path, hf_cache_dir: Path | None = None) -> list[ModelInfo]:
        self.threads.append(threading.current_thread())
        self.calls += 1
        self.open.wait(5)  # without the change this blocks the GUI thread, then carries on
        return self._scan(models_dir, hf_cache_dir)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    gate = Gate()
    monkeypatch.setattr(library, "scan_library", gate)
    return gate


def _info(name: str) -> ModelInfo:
    return ModelInfo(name, Path("/m") / name, "tandem", None, "llama", 1, None, 1, 8, True, None)


def test_the_model_manager_says_scanning_until_the_scan_lands(
    qtbot: QtBot, gate: Gate, tiny: TinyModels, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    shutil.copytree(tiny.target, models / "tiny-llama")
    try:
        dialog = ModelManagerDialog(models, hf_cache_dir=tmp_path / "hf", target=str(tiny.draft))
        qtbot.addWidget(dialog)
        dialog.show()
        # The dialog is up while the scan still waits: the GUI thread did not block on it.
        assert not gate.open.is_set() and threading.main_thread() not in gate.threads
        assert dialog.scanning and dialog.library.rowCount() == 0
        assert dialog.table.empty_hint() == SCANNING_HINT
        assert "scanning" in dialog.drafts_label.text()
    finally:
        gate.open.set()
    qtbot.waitUntil(lambda: dialog.library.rowCount() == 1, timeout=5_000)
    info = dialog.library.info_at(0)
    assert info is not None and info.name == "tiny-llama"
    assert not dialog.scanning and dialog.table.empty_hint() == ""
    assert gate.threads and threading.main_thread() not in gate.threads
    # The target outside the library was described by the scan too, not on the GUI thread.
    assert tiny.draft.name in dialog.drafts_label.text()


def test_the_window_answers_from_the_last_scan(
    qtbot: QtBot, gate: Gate, make_window, tiny: TinyModels
) -> None:
    try:
        window = make_window(library=(tiny.target,))
        assert not gate.open.is_set() and threading.main_thread() not in gate.threads
        assert window.pair_loading.library() == []  # nothing scanned yet, at once
        assert not window.library_prompt.isVisible()
    finally:
        gate.open.set()
    qtbot.waitUntil(window.library_prompt.isVisible, timeout=5_000)
    assert window.onboarding is None  # a library with models needs no first-run view
    calls = gate.calls
    assert [m.name for m in window.pair_loading.library()] == ["tiny-llama"]
    qtbot.waitUntil(lambda: gate.calls > calls, timeout=5_000)  # and it asked for a rescan
    assert threading.main_thread() not in gate.threads


def test_an_older_scan_is_dropped_when_a_newer_one_was_asked(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    answers = iter([[_info("old")], [_info("new")]])
    gate = Gate(lambda *_: next(answers))
    monkeypatch.setattr(library, "scan_library", gate)
    scanner = LibraryScanner()
    seen: list[LibraryScan] = []
    scanner.scanned.connect(seen.append)
    first = scanner.scan(tmp_path)
    second = scanner.scan(tmp_path)  # while the first still runs
    assert second > first and scanner.latest is None
    gate.open.set()
    qtbot.waitUntil(lambda: bool(seen), timeout=5_000)
    qtbot.wait(50)  # room for a stale answer to arrive, were it sent
    assert [(s.generation, [m.name for m in s.models]) for s in seen] == [(second, ["new"])]
    assert scanner.latest == seen[0] and gate.calls == 2
    assert scanner.stop()


def test_a_failed_scan_says_why(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def refuse(*_: object) -> list[ModelInfo]:
        raise PermissionError("Permission denied: 'models'")

    monkeypatch.setattr(library, "scan_library", refuse)
    dialog = ModelManagerDialog(tmp_path, hf_cache_dir=tmp_path / "hf")
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: not dialog.scanning, timeout=5_000)
    assert dialog.table.empty_hint() == "Could not read the library: Permission denied: 'models'"


def test_stop_waits_for_the_running_scan_and_drops_its_answer(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ended = threading.Event()

    def late(*_: object) -> list[ModelInfo]:
        ended.set()
        return [_info("late")]

    slow = Gate(late)
    monkeypatch.setattr(library, "scan_library", slow)
    scanner = LibraryScanner()
    scanner.scan(tmp_path)
    threading.Timer(0.05, slow.open.set).start()
    assert scanner.stop(5_000)
    assert ended.is_set()  # quitting left no scan running
    with qtbot.assertNotEmitted(scanner.scanned, wait=50):
        scanner.scan(tmp_path)  # and a stopped scanner scans no more
    assert scanner.latest is None and slow.calls == 1
