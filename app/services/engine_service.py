"""The engine thread: one long-lived QThread that does all MLX work.

MLX arrays and streams belong to the thread that made them, so models are
loaded, run and released on this one thread. Requests arrive as queued signals;
results leave as immutable dataclasses; errors leave as values on ``failed``.
Stop sets the request's ``threading.Event``, which the engine checks every round.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.engine.generate import stream_reply
from app.engine.loader import ModelError, ModelPair, free_memory, load_pair
from app.engine.types import Chunk, Finished, GenerationParams, Message, Origin

log = logging.getLogger(__name__)

FLUSH_INTERVAL = 1 / 30  # seconds between UI updates while streaming

StreamFn = Callable[
    [ModelPair, Sequence[Message], GenerationParams, threading.Event],
    Iterator[Chunk | Finished],
]
# load(target, draft, progress=callback(step, steps, what)) -> pair
LoadFn = Callable[..., ModelPair]


@dataclass(frozen=True, slots=True)
class LoadRequest:
    target: str
    draft: str | None = None


@dataclass(frozen=True, slots=True)
class LoadProgress:
    """A pair is loading: ``step`` of ``steps`` done, ``text`` says what runs now."""

    step: int
    steps: int
    text: str


@dataclass(frozen=True, slots=True)
class PairInfo:
    """What the UI knows of the loaded pair."""

    target: str
    draft: str | None
    label: str


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    request_id: int
    messages: tuple[Message, ...]
    params: GenerationParams
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """Reply text and tokens since the previous batch."""

    request_id: int
    text: str
    token_ids: tuple[int, ...]
    origins: tuple[Origin, ...]


@dataclass(frozen=True, slots=True)
class GenerationResult:
    request_id: int
    text: str
    finished: Finished
    pair: PairInfo


@dataclass(frozen=True, slots=True)
class EngineFailure:
    """An error as a value. ``text`` holds any reply streamed before it."""

    request_id: int | None
    stage: Literal["load", "generate"]
    message: str
    text: str = ""


def _memory_fit(request: LoadRequest) -> Any:
    """The pair's memory fit, or ``None`` when the folders cannot be judged (load says why)."""
    from app.engine.loader import ModelError
    from app.hub.fit import memory_fit

    try:
        return memory_fit(Path(request.target), Path(request.draft) if request.draft else None)
    except (ModelError, OSError):
        return None


class EngineWorker(QObject):
    """Lives on the engine thread; every slot runs there."""

    load_progressed = Signal(object)  # LoadProgress
    pair_loaded = Signal(object)  # PairInfo
    generation_started = Signal(int)
    tokens_generated = Signal(object)  # TokenBatch
    generation_finished = Signal(object)  # GenerationResult
    failed = Signal(object)  # EngineFailure

    def __init__(
        self,
        load: LoadFn = load_pair,
        stream: StreamFn = stream_reply,
        flush_interval: float = FLUSH_INTERVAL,
    ) -> None:
        super().__init__()
        self._load = load
        self._stream = stream
        self._flush_interval = flush_interval
        self._pair: ModelPair | None = None
        self._info: PairInfo | None = None

    @Slot(object)
    def _on_load_requested(self, request: LoadRequest) -> None:
        self.load_progressed.emit(LoadProgress(0, 1, "Checking memory"))
        fit = _memory_fit(request)
        if fit is not None and not fit.fits:
            self.failed.emit(EngineFailure(None, "load", f"This pair does not fit: {fit.detail}"))
            return

        def report(step: int, steps: int, text: str) -> None:
            self.load_progressed.emit(LoadProgress(step, steps, text))

        try:
            pair = self._load(request.target, request.draft, progress=report)
        except ModelError as exc:
            self.failed.emit(EngineFailure(None, "load", str(exc)))
            return
        except Exception as exc:
            log.exception("loading %s failed", request.target)
            self.failed.emit(EngineFailure(None, "load", f"Loading failed: {exc}"))
            return
        # The new pair replaces the old only once it loaded.
        self._pair = pair
        free_memory()
        self._info = PairInfo(request.target, request.draft, pair.label)
        self.pair_loaded.emit(self._info)

    @Slot(object)
    def _on_generate_requested(self, request: GenerateRequest) -> None:
        rid = request.request_id
        if self._pair is None or self._info is None:
            self.failed.emit(EngineFailure(rid, "generate", "No model is loaded."))
            return
        self.generation_started.emit(rid)
        text: list[str] = []
        pending: list[Chunk] = []
        last_flush = time.monotonic()

        def flush() -> None:
            if pending:
                self.tokens_generated.emit(
                    TokenBatch(
                        rid,
                        "".join(c.text for c in pending),
                        tuple(t for c in pending for t in c.token_ids),
                        tuple(o for c in pending for o in c.origins),
                    )
                )
                pending.clear()

        try:
            for event in self._stream(self._pair, request.messages, request.params, request.cancel):
                if isinstance(event, Chunk):
                    text.append(event.text)
                    pending.append(event)
                    now = time.monotonic()
                    if now - last_flush >= self._flush_interval:
                        flush()
                        last_flush = now
                else:
                    flush()
                    result = GenerationResult(rid, "".join(text), event, self._info)
                    self.generation_finished.emit(result)
        except Exception as exc:
            log.exception("generation failed")
            flush()
            self.failed.emit(
                EngineFailure(rid, "generate", f"Generation failed: {exc}", "".join(text))
            )

    @Slot()
    def _on_shutdown_requested(self) -> None:
        self._pair = None
        free_memory()
        thread = self.thread()
        thread.quit()


class EngineService(QObject):
    """Owns the engine thread; the UI talks to the engine only through this."""

    load_requested = Signal(object)
    generate_requested = Signal(object)
    shutdown_requested = Signal()

    load_progressed = Signal(object)
    pair_loaded = Signal(object)
    generation_started = Signal(int)
    tokens_generated = Signal(object)
    generation_finished = Signal(object)
    failed = Signal(object)

    def __init__(self, worker: EngineWorker | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self._ids = itertools.count(1)
        self._current: GenerateRequest | None = None
        self._thread = QThread()
        self._thread.setObjectName("tandem-engine")
        self._worker = worker or EngineWorker()
        self._worker.moveToThread(self._thread)
        self.load_requested.connect(self._worker._on_load_requested)
        self.generate_requested.connect(self._worker._on_generate_requested)
        self.shutdown_requested.connect(self._worker._on_shutdown_requested)
        self._worker.load_progressed.connect(self.load_progressed)
        self._worker.pair_loaded.connect(self.pair_loaded)
        self._worker.generation_started.connect(self.generation_started)
        self._worker.tokens_generated.connect(self.tokens_generated)
        self._worker.generation_finished.connect(self._on_generation_finished)
        self._worker.failed.connect(self._on_failed)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """Whether a reply is being generated."""
        return self._current is not None

    def load_pair(self, target: str, draft: str | None = None) -> None:
        self.load_requested.emit(LoadRequest(target, draft))

    def generate(self, messages: Sequence[Message], params: GenerationParams) -> int:
        """Queues a reply and returns its request id."""
        request = GenerateRequest(next(self._ids), tuple(messages), params)
        self._current = request
        self.generate_requested.emit(request)
        return request.request_id

    def stop(self) -> None:
        """Stops the current reply within one engine round."""
        if self._current is not None:
            self._current.cancel.set()

    def shutdown(self, timeout_ms: int = 30_000) -> bool:
        """Stops generation, releases the models on their thread and joins it."""
        if not self._thread.isRunning():
            return True
        self.stop()
        self.shutdown_requested.emit()
        return self._thread.wait(timeout_ms)

    @Slot(object)
    def _on_generation_finished(self, result: GenerationResult) -> None:
        if self._current is not None and self._current.request_id == result.request_id:
            self._current = None
        self.generation_finished.emit(result)

    @Slot(object)
    def _on_failed(self, failure: EngineFailure) -> None:
        if self._current is not None and self._current.request_id == failure.request_id:
            self._current = None
        self.failed.emit(failure)
