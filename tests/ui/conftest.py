"""Fakes for the UI tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Signal
from pytestqt.qtbot import QtBot

from app.services import EngineService, EngineWorker
from app.store import SettingsFile, Store
from app.ui.main_window import MainWindow


class FakeHub(QObject):
    """Records tasks; the test decides how they end."""

    progressed = Signal(object)
    finished = Signal(object)
    searched = Signal(object)
    failed = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.started: list[tuple[str, str, str | None]] = []
        self.bits: list[int | None] = []  # each task's q_bits
        self.heads: list[str | None] = []  # each task's MTP head file
        self.cancelled: list[int] = []

    def start(self, kind, source, models_dir, *, token=None, q_bits=None, mtp=None) -> int:  # type: ignore[no-untyped-def]
        self.started.append((kind, source, token))
        self.bits.append(q_bits)
        self.heads.append(mtp)
        return len(self.started)

    def search(self, query: str, *, token: str | None = None) -> int:
        return self.start("search", query, None, token=token)

    def cancel(self, task_id: int | None = None) -> None:
        assert task_id is not None
        self.cancelled.append(task_id)

    def shutdown(self, timeout_ms: int = 0) -> bool:
        return True


@pytest.fixture
def make_window(qtbot: QtBot, tmp_path: Path) -> Iterator:
    made: list[tuple[MainWindow, EngineService, Store]] = []

    def make(worker: EngineWorker | None = None, library: tuple[Path, ...] = ()) -> MainWindow:
        models = tmp_path / "models"
        models.mkdir(exist_ok=True)
        for folder in library:
            shutil.copytree(folder, models / folder.name, dirs_exist_ok=True)
        store = Store(tmp_path / "tandem.sqlite3")
        service = EngineService(worker)
        window = MainWindow(
            store, service, SettingsFile(tmp_path / "settings.json"), models_dir=models
        )
        qtbot.addWidget(window)
        window.show()
        made.append((window, service, store))
        return window

    yield make
    for window, service, store in made:
        window.close()
        assert service.shutdown()
        store.close()
