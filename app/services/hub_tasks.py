"""Hub tasks run as one group: the first-run downloads and the model manager's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

from PySide6.QtCore import QObject, Signal, Slot

from app.keychain import stored_token
from app.services.hub_service import HubFailure, HubProgress, HubResult, HubService, Kind


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """Task ``step`` of ``steps`` runs; ``fraction`` of it is done; ``text`` says what.

    ``detail`` is the hub's own report, with the current file of a download.
    """

    step: int
    steps: int
    fraction: float
    text: str
    detail: HubProgress


class HubTaskGroup(QObject):
    """Downloads or imports that belong together, such as a target and its draft.

    It listens to the hub and passes on only its own tasks' news. A group is no
    use unless every task ends well, so when one fails the others are cancelled.

    Signals:
        progressed: A :class:`GroupProgress`.
        finished: The tasks' result paths, in the order they were started.
        failed: One line saying why a task failed.
    """

    progressed = Signal(object)
    finished = Signal(object)  # tuple[str, ...]
    failed = Signal(str)

    def __init__(self, hub: HubService, models_dir: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._hub = hub
        self._models_dir = models_dir
        self._tasks: list[int] = []
        self._paths: dict[int, str] = {}
        hub.progressed.connect(self._on_progressed)
        hub.finished.connect(self._on_finished)
        hub.failed.connect(self._on_failed)

    @property
    def running(self) -> bool:
        return bool(self._tasks)

    def start(
        self, tasks: list[tuple[str, str]], q_bits: int | None = None, mtp: str | None = None
    ) -> None:
        """Starts ``(kind, source)`` tasks; downloads get the stored Hub token.

        Args:
            tasks: What to run, in order.
            q_bits: Quantize imports to this many bits: GGUF files, and folders of
                unquantized weights (``None``: as they are).
            mtp: The MTP head's own file, for the GGUF import among ``tasks``.
        """
        token = stored_token() if any(kind == "download" for kind, _ in tasks) else None
        self._paths = {}
        self._tasks = [
            self._hub.start(
                cast(Kind, kind),
                source,
                self._models_dir,
                token=token if kind == "download" else None,
                q_bits=q_bits,
                mtp=mtp if kind == "import-gguf" else None,
            )
            for kind, source in tasks
        ]

    def cancel(self) -> None:
        """Cancels the group's tasks (the hub ignores those that ended)."""
        for task in self._tasks:
            self._hub.cancel(task)

    def forget(self) -> None:
        """Stops listening for the tasks started so far."""
        self._tasks, self._paths = [], {}

    @Slot(object)
    def _on_progressed(self, p: HubProgress) -> None:
        if p.task_id not in self._tasks:
            return
        fraction = p.done / p.total if p.total > 0 else 0.0
        step = self._tasks.index(p.task_id) + 1
        self.progressed.emit(GroupProgress(step, len(self._tasks), fraction, p.text, p))

    @Slot(object)
    def _on_finished(self, result: HubResult) -> None:
        if result.task_id not in self._tasks:
            return
        self._paths[result.task_id] = str(result.path)
        if len(self._paths) == len(self._tasks):
            paths = tuple(self._paths[t] for t in self._tasks)
            self.forget()
            self.finished.emit(paths)

    @Slot(object)
    def _on_failed(self, failure: HubFailure) -> None:
        if failure.task_id not in self._tasks:
            return
        for task in self._tasks:  # a pair is no use without both
            if task != failure.task_id and task not in self._paths:
                self._hub.cancel(task)
        self.forget()
        self.failed.emit(failure.message)
