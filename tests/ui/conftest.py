"""Fakes for the UI tests."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal


class FakeHub(QObject):
    """Records tasks; the test decides how they end."""

    progressed = Signal(object)
    finished = Signal(object)
    searched = Signal(object)
    failed = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.started: list[tuple[str, str, str | None]] = []
        self.cancelled: list[int] = []

    def start(self, kind, source, models_dir, *, token=None, q_bits=None) -> int:  # type: ignore[no-untyped-def]
        self.started.append((kind, source, token))
        return len(self.started)

    def search(self, query: str, *, token: str | None = None) -> int:
        return self.start("search", query, None, token=token)

    def cancel(self, task_id: int | None = None) -> None:
        assert task_id is not None
        self.cancelled.append(task_id)

    def shutdown(self, timeout_ms: int = 0) -> bool:
        return True
