"""The engine thread: one long-lived QThread that does all MLX work.

MLX arrays and streams belong to the thread that made them, so models are
loaded, run and released on this one thread. Requests arrive as queued signals
and run one after another; results leave as immutable dataclasses; errors leave
as values on ``failed``, each naming the caller it belongs to (its stage and
request id). Starting a reply or a calibration returns a handle that only its
owner holds: its ``cancel()`` sets that request's own ``threading.Event``, which
the engine checks every round, so there is no stop that reaches another
caller's reply. A request cancelled while it waits is dropped when it reaches
the engine, without running.
When MLX runs out of memory the worker drops the pair, gives the memory back
and says so; the app stays up and the pair can be loaded again.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.engine.costs import ProfileStore
from app.engine.generate import PromptTooLongError, new_decoder, stream_reply
from app.engine.loader import LoadProgress, ModelPair, free_memory
from app.engine.speculative import Decoder, DraftControl
from app.engine.types import (
    Chunk,
    Finished,
    GenerationParams,
    Message,
    Origin,
    Reading,
    RoundStat,
    Segment,
    Stats,
    add_segments,
)
from app.errors import ModelError
from app.hub.pair_check import load_checked_pair
from app.logs import private
from app.remote import RemoteEngine, check_remote, is_remote_target, stream_remote

log = logging.getLogger(__name__)

FLUSH_INTERVAL = 1 / 30  # seconds between UI updates while streaming
RUN_PROGRESS_SECONDS = 0.25  # seconds between a calibration run's progress events
# What MLX and Metal say when an allocation fails, lowercased.
_OUT_OF_MEMORY = ("out of memory", "insufficient memory", "[metal::malloc]")
UNLOADED = "the models were unloaded to free memory"

# stream(pair, messages, params, cancel, control=...) -> readings, chunks, then Finished
StreamFn = Callable[..., Iterator[Reading | Chunk | Finished]]
# load(target, draft, progress=callback(LoadProgress), loaded=pair in memory) -> pair;
# a model of ``loaded`` that the new pair names again is kept, not read twice.
LoadFn = Callable[..., ModelPair]
# check(engine) raises ModelError when the server cannot serve
CheckFn = Callable[[RemoteEngine], None]
# stream(engine, messages, params, cancel) -> chunks, then Finished
RemoteStreamFn = Callable[..., Iterator[Chunk | Finished]]


@dataclass(frozen=True, slots=True)
class LoadRequest:
    """A pair of model folders, or a remote engine.

    A ``target`` that starts with ``http://`` or ``https://`` is a remote engine
    (:meth:`RemoteEngine.to_target` puts its kind and model in the fragment);
    ``remote`` gives one directly and wins over ``target``.
    """

    target: str
    draft: str | None = None
    remote: RemoteEngine | None = None

    def remote_engine(self) -> RemoteEngine | None:
        """The remote engine this request names, or ``None`` for local folders.

        Raises:
            ValueError: The target is an http(s) address that cannot be read.
        """
        if self.remote is not None:
            return self.remote
        return RemoteEngine.from_target(self.target) if is_remote_target(self.target) else None


@dataclass(frozen=True, slots=True)
class PairInfo:
    """What the UI knows of the loaded pair."""

    target: str
    draft: str | None
    label: str
    context_length: int | None = None  # the target's window, in tokens


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    request_id: int
    messages: tuple[Message, ...]
    params: GenerationParams
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)
    # The draft length from the next round on; the UI may change it mid-reply.
    control: DraftControl = field(default_factory=DraftControl, compare=False)


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """Reply text, tokens and rounds since the previous batch.

    ``segments`` is ``text`` in runs by origin (``None`` for text that
    completes no token, such as the tail after the last one).
    ``prompt_tokens`` is the reply's prompt length, when the engine said.
    """

    request_id: int
    text: str
    token_ids: tuple[int, ...]
    origins: tuple[Origin, ...]
    segments: tuple[Segment, ...] = ()
    rounds: tuple[RoundStat, ...] = ()
    baseline_tps: float | None = None
    prompt_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class PromptProgress:
    """How far the target has read a reply's prompt, before its first token."""

    request_id: int
    reading: Reading


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """How a reply ended. Its text came in :class:`TokenBatch` values; the caller
    collects them (the engine does not collect a reply a second time)."""

    request_id: int
    finished: Finished
    pair: PairInfo


@dataclass(frozen=True, slots=True)
class CalibrateRequest:
    request_id: int
    prompts: tuple[str, ...]
    ks: tuple[int | None, ...]
    max_tokens: int = 64
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)


@dataclass(frozen=True, slots=True)
class EngineFailure:
    """An error as a value; any reply streamed before it came in token batches.

    It belongs to one caller: ``stage`` ``"load"`` (``request_id`` is ``None``),
    ``"generate"`` (the reply whose :attr:`ReplyHandle.request_id` it carries)
    or ``"calibrate"`` (that calibration's id). A caller shows only its own.
    ``unloaded`` says the engine dropped its pair (it ran out of memory), so no
    model is loaded any more, whoever's request it was.
    """

    request_id: int | None
    stage: Literal["load", "generate", "calibrate"]
    message: str
    unloaded: bool = False
    too_long: bool = False  # the conversation does not fit the context window


class CalibrationHandle:
    """One calibration, as :meth:`EngineService.calibrate` started it.

    Safe to use from any thread: it only sets the request's own event.
    """

    __slots__ = ("_cancel", "_request_id")

    def __init__(self, request_id: int, cancel: threading.Event) -> None:
        self._request_id = request_id
        self._cancel = cancel

    @property
    def request_id(self) -> int:
        """The id its progress, result and failure carry."""
        return self._request_id

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Stops this calibration within one step; it finishes without a result."""
        self._cancel.set()


class ReplyHandle:
    """One reply, as :meth:`EngineService.generate` started it.

    Only the caller that started the reply holds it, so stopping or retuning
    one reply never reaches another. Safe to use from any thread: it sets the
    request's own event and draft control, which the engine reads every round.
    """

    __slots__ = ("_request",)

    def __init__(self, request: GenerateRequest) -> None:
        self._request = request

    @property
    def request_id(self) -> int:
        """The id its batches, result and failure carry."""
        return self._request.request_id

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._request.cancel.is_set()

    def cancel(self) -> None:
        """Stops this reply within one round; one that still waits never runs.

        Either way it ends as usual, with a result whose finish reason is
        ``"cancelled"`` (or a failure).
        """
        self._request.cancel.set()

    def set_draft_length(self, num_draft: int | None) -> None:
        """Changes this reply's draft length from its next round on.

        Raises:
            ValueError: ``num_draft`` is out of range.
        """
        self._request.control.set(num_draft)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure: a ``MemoryError`` or MLX's own words."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(s in text for s in _OUT_OF_MEMORY)


def _out_of_memory_message(action: str, exc: BaseException, again: str) -> str:
    """One line for the user: what failed, that the pair is gone, what to do."""
    lines = str(exc).strip().splitlines()
    reason = lines[0] if lines else "out of memory"
    return f"{action} failed: {reason}; {UNLOADED}. {again}"


def _memory_fit(request: LoadRequest, loaded: ModelPair | None) -> Any:
    """The pair's memory fit, or ``None`` when the folders cannot be judged (load says why).

    The loaded pair stays in memory until the new one is in, so it counts
    against the memory available; a model both share counts once.
    """
    from app.hub.fit import memory_fit

    in_memory = [m.path for m in (loaded.target, loaded.draft) if m] if loaded else []
    try:
        return memory_fit(
            Path(request.target),
            Path(request.draft) if request.draft else None,
            loaded=in_memory,
        )
    except Exception:  # whatever the estimate trips on, loading says it in one line
        log.debug("no memory estimate for %s", request.target, exc_info=True)
        return None


def _pieces(chunk: Chunk) -> tuple[list[str], list[Origin | None]]:
    """A chunk's text per token, with any text no token carries as origin ``None``."""
    pieces: list[str] = list(chunk.pieces)
    origins: list[Origin | None] = list(chunk.origins[: len(pieces)])
    rest = chunk.text[len("".join(pieces)) :]
    if rest:
        pieces.append(rest)
        origins.append(None)
    return pieces, origins


class EngineWorker(QObject):
    """Lives on the engine thread; every slot runs there."""

    load_progressed = Signal(object)  # LoadProgress
    pair_loaded = Signal(object)  # PairInfo
    calibration_progressed = Signal(object)  # CalibrationProgress
    calibration_finished = Signal(object)  # CalibrationResult, or None when cancelled
    generation_started = Signal(int)
    prompt_progressed = Signal(object)  # PromptProgress
    tokens_generated = Signal(object)  # TokenBatch
    generation_finished = Signal(object)  # GenerationResult
    failed = Signal(object)  # EngineFailure

    def __init__(
        self,
        load: LoadFn = load_checked_pair,  # refuses what check-pair refuses
        stream: StreamFn = stream_reply,
        flush_interval: float = FLUSH_INTERVAL,
        check_remote: CheckFn = check_remote,
        stream_remote: RemoteStreamFn = stream_remote,
        profiles: ProfileStore | None = None,
    ) -> None:
        super().__init__()
        # Where loaded pairs keep their cost profiles; None: the default data folder.
        self._profiles = profiles
        self._load = load
        self._stream = stream
        self._flush_interval = flush_interval
        self._check_remote = check_remote
        self._stream_remote = stream_remote
        self._pair: ModelPair | None = None
        # The loaded pair's decoder: both KV caches, kept across this pair's turns.
        self._decoder: Decoder | None = None
        self._remote: RemoteEngine | None = None
        self._info: PairInfo | None = None

    def _set_pair(self, pair: ModelPair | None) -> None:
        """Makes ``pair`` the loaded one, with a decoder of its own (costs in this folder)."""
        self._pair = pair
        self._decoder = new_decoder(pair, self._profiles) if pair is not None else None

    def _load_remote(self, request: LoadRequest) -> bool:
        """Connects a remote engine instead of a local pair; ``False`` for local folders."""
        try:
            remote = request.remote_engine()
        except ValueError as exc:
            self.failed.emit(EngineFailure(None, "load", f"Cannot use this server: {exc}"))
            return True
        if remote is None:
            return False
        # No memory check: the server's memory is its own business.
        self.load_progressed.emit(LoadProgress(0, 1, f"Connecting to {remote.host}"))
        try:
            self._check_remote(remote)
        except ModelError as exc:
            self.failed.emit(EngineFailure(None, "load", str(exc)))
            return True
        # The local pair, if any, goes: one engine serves the chat at a time.
        self._set_pair(None)
        free_memory()
        self._remote = remote
        self._info = PairInfo(remote.to_target(), None, remote.label, None)
        log.info("connected %s", remote.label)
        self.load_progressed.emit(LoadProgress(1, 1, "Connected"))
        self.pair_loaded.emit(self._info)
        return True

    @Slot(object)
    def _on_load_requested(self, request: LoadRequest) -> None:
        if self._load_remote(request):
            return
        self.load_progressed.emit(LoadProgress(0, 1, "Checking memory"))
        fit = _memory_fit(request, self._pair)
        if fit is not None and not fit.fits:
            # Refused before any weight is read; the loaded pair stays as it was.
            self.failed.emit(EngineFailure(None, "load", f"This pair does not fit: {fit.detail}"))
            return

        try:
            pair = self._load(
                request.target,
                request.draft,
                progress=self.load_progressed.emit,
                loaded=self._pair,
            )
        except ModelError as exc:
            self.failed.emit(EngineFailure(None, "load", str(exc)))
            return
        except Exception as exc:
            log.exception("loading %s failed", request.target)
            self.failed.emit(self._unexpected(exc, "load", None, "Loading"))
            return
        # The new pair replaces the old only once it loaded.
        self._set_pair(pair)
        self._remote = None
        free_memory()
        self._info = PairInfo(request.target, request.draft, pair.label, pair.target.context_length)
        log.info("loaded %s", pair.label)
        self.pair_loaded.emit(self._info)

    def _unexpected(
        self,
        exc: Exception,
        stage: Literal["load", "generate", "calibrate"],
        request_id: int | None,
        action: str,
    ) -> EngineFailure:
        """The failure for an error no stage expects; running out of memory drops the pair."""
        if not is_out_of_memory(exc):
            return EngineFailure(request_id, stage, f"{action} failed: {exc}")
        self._release(exc)
        again = (
            "Choose a smaller pair, or quit other apps."
            if stage == "load"
            else "Load them again, or choose a smaller pair."
        )
        message = _out_of_memory_message(action, exc, again)
        return EngineFailure(request_id, stage, message, unloaded=True)

    def _release(self, exc: BaseException) -> None:
        """Drops the pair and returns MLX's cached memory to the system.

        The frames of ``exc``'s traceback hold arrays too, and logging may keep
        the exception, so they are cleared first.
        """
        traceback.clear_frames(exc.__traceback__)
        self._set_pair(None)
        self._info = None
        free_memory()
        log.warning("out of memory: the pair was unloaded")

    @Slot(object)
    def _on_generate_requested(self, request: GenerateRequest) -> None:
        rid = request.request_id
        if request.cancel.is_set() and self._info is not None:
            # Withdrawn while it waited: it ends at once, and nothing runs.
            log.debug("reply %d withdrawn before it started", rid)
            finished = Finished(Stats(), "cancelled")
            self.generation_finished.emit(GenerationResult(rid, finished, self._info))
            return
        if (self._pair is None and self._remote is None) or self._info is None:
            self.failed.emit(EngineFailure(rid, "generate", "No model is loaded."))
            return
        last = request.messages[-1].content if request.messages else ""
        log.debug("reply %d to: %s", rid, private(last))
        self.generation_started.emit(rid)
        pending: list[Chunk] = []
        last_flush = time.monotonic()

        def flush() -> None:
            if pending:
                batch: list[Segment] = []
                for c in pending:
                    add_segments(batch, *_pieces(c))
                self.tokens_generated.emit(
                    TokenBatch(
                        rid,
                        "".join(c.text for c in pending),
                        tuple(t for c in pending for t in c.token_ids),
                        tuple(o for c in pending for o in c.origins),
                        tuple(batch),
                        tuple(c.round for c in pending if c.round is not None),
                        pending[-1].baseline_tps,
                        next((c.prompt_tokens for c in pending if c.prompt_tokens), None),
                    )
                )
                pending.clear()

        events: Iterator[Reading | Chunk | Finished]
        try:
            if self._remote is not None:
                events = self._stream_remote(
                    self._remote, request.messages, request.params, request.cancel
                )
            else:
                events = self._stream(
                    self._pair,
                    request.messages,
                    request.params,
                    request.cancel,
                    control=request.control,
                    decoder=self._decoder,
                )
            read_at: float | None = None  # when a Reading was last passed on
            for event in events:
                if isinstance(event, Reading):
                    now = time.monotonic()
                    if read_at is None or now - read_at >= self._flush_interval:
                        self.prompt_progressed.emit(PromptProgress(rid, event))
                        read_at = now
                elif isinstance(event, Chunk):
                    pending.append(event)
                    now = time.monotonic()
                    if now - last_flush >= self._flush_interval:
                        flush()
                        last_flush = now
                else:
                    flush()
                    self.generation_finished.emit(GenerationResult(rid, event, self._info))
        except ModelError as exc:  # the pair cannot serve this request; says why
            flush()
            too_long = isinstance(exc, PromptTooLongError)
            self.failed.emit(EngineFailure(rid, "generate", str(exc), too_long=too_long))
        except Exception as exc:
            log.exception("generation failed")
            flush()
            self.failed.emit(self._unexpected(exc, "generate", rid, "Generation"))

    @Slot(object)
    def _on_calibrate_requested(self, request: CalibrateRequest) -> None:
        from app.engine.calibrate import CalibrationProgress, calibrate

        rid = request.request_id
        if request.cancel.is_set():  # withdrawn while it waited
            self.calibration_finished.emit(None)
            return
        if self._remote is not None:
            message = "Calibration needs a local pair; a remote engine is connected."
            self.failed.emit(EngineFailure(rid, "calibrate", message))
            return
        if self._pair is None:
            self.failed.emit(EngineFailure(rid, "calibrate", "No model is loaded."))
            return
        result = None
        try:
            for event in calibrate(
                self._pair,
                request.prompts,
                request.ks,
                max_tokens=request.max_tokens,
                cancel=request.cancel,
                decoder=self._decoder,
                progress_every=RUN_PROGRESS_SECONDS,
            ):
                if isinstance(event, CalibrationProgress):
                    self.calibration_progressed.emit(event)
                else:
                    result = event
        except (ModelError, ValueError) as exc:
            self.failed.emit(EngineFailure(rid, "calibrate", str(exc)))
            return
        except Exception as exc:
            log.exception("calibration failed")
            self.failed.emit(self._unexpected(exc, "calibrate", rid, "Calibration"))
            return
        self.calibration_finished.emit(result)

    @Slot()
    def _on_shutdown_requested(self) -> None:
        self._set_pair(None)
        self._remote = None
        free_memory()
        thread = self.thread()
        thread.quit()


class EngineService(QObject):
    """Owns the engine thread; the UI talks to the engine only through this."""

    load_requested = Signal(object)
    generate_requested = Signal(object)
    calibrate_requested = Signal(object)
    shutdown_requested = Signal()

    load_progressed = Signal(object)
    pair_loaded = Signal(object)
    calibration_progressed = Signal(object)
    calibration_finished = Signal(object)
    generation_started = Signal(int)
    prompt_progressed = Signal(object)
    tokens_generated = Signal(object)
    generation_finished = Signal(object)
    failed = Signal(object)

    def __init__(self, worker: EngineWorker | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self._ids = itertools.count(1)
        # Requests sent and not yet ended, queued or running, in the order sent.
        self._replies: dict[int, GenerateRequest] = {}
        self._calibrations: dict[int, CalibrateRequest] = {}
        self._thread = QThread()
        self._thread.setObjectName("tandem-engine")
        self._worker = worker or EngineWorker()
        self._worker.moveToThread(self._thread)
        self.load_requested.connect(self._worker._on_load_requested)
        self.generate_requested.connect(self._worker._on_generate_requested)
        self.calibrate_requested.connect(self._worker._on_calibrate_requested)
        self.shutdown_requested.connect(self._worker._on_shutdown_requested)
        self._worker.load_progressed.connect(self.load_progressed)
        self._worker.pair_loaded.connect(self.pair_loaded)
        self._worker.calibration_progressed.connect(self.calibration_progressed)
        self._worker.calibration_finished.connect(self._on_calibration_finished)
        self._worker.generation_started.connect(self.generation_started)
        self._worker.prompt_progressed.connect(self.prompt_progressed)
        self._worker.tokens_generated.connect(self.tokens_generated)
        self._worker.generation_finished.connect(self._on_generation_finished)
        self._worker.failed.connect(self._on_failed)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """Whether any caller's reply or calibration is queued or running."""
        return bool(self._replies or self._calibrations)

    def calibrate(
        self, prompts: Sequence[str], ks: Sequence[int | None], max_tokens: int = 64
    ) -> CalibrationHandle:
        """Queues a draft-length sweep on the loaded pair; returns the handle that stops it."""
        request = CalibrateRequest(next(self._ids), tuple(prompts), tuple(ks), max_tokens)
        self._calibrations[request.request_id] = request
        self.calibrate_requested.emit(request)
        return CalibrationHandle(request.request_id, request.cancel)

    def load_pair(self, target: str, draft: str | None = None) -> None:
        """Loads a local pair, or connects a remote engine when ``target`` is an http(s) URL."""
        self.load_requested.emit(LoadRequest(target, draft))

    def load_remote(self, engine: RemoteEngine) -> None:
        """Connects ``engine`` in place of any loaded pair."""
        self.load_requested.emit(LoadRequest(engine.to_target(), None, engine))

    def generate(self, messages: Sequence[Message], params: GenerationParams) -> ReplyHandle:
        """Queues a reply behind any others; returns the handle that stops and retunes it."""
        control = DraftControl(params.num_draft)
        request = GenerateRequest(next(self._ids), tuple(messages), params, control=control)
        self._replies[request.request_id] = request
        self.generate_requested.emit(request)
        return ReplyHandle(request)

    def shutdown(self, timeout_ms: int = 30_000) -> bool:
        """Stops every caller's work, releases the models on their thread and joins it."""
        if not self._thread.isRunning():
            return True
        for reply in self._replies.values():
            reply.cancel.set()
        for calibration in self._calibrations.values():
            calibration.cancel.set()
        self.shutdown_requested.emit()
        return self._thread.wait(timeout_ms)

    @Slot(object)
    def _on_generation_finished(self, result: GenerationResult) -> None:
        self._replies.pop(result.request_id, None)
        self.generation_finished.emit(result)

    @Slot(object)
    def _on_calibration_finished(self, result: object) -> None:
        # Calibrations end in the order they were sent: this is the oldest.
        if self._calibrations:
            del self._calibrations[next(iter(self._calibrations))]
        self.calibration_finished.emit(result)

    @Slot(object)
    def _on_failed(self, failure: EngineFailure) -> None:
        if failure.request_id is not None:
            if failure.stage == "generate":
                self._replies.pop(failure.request_id, None)
            elif failure.stage == "calibrate":
                self._calibrations.pop(failure.request_id, None)
        self.failed.emit(failure)
