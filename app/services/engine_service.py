"""The engine thread: one long-lived QThread that does all MLX work.

MLX arrays and streams belong to the thread that made them, so models are
loaded, run and released on this one thread. Loads and calibrations arrive as
queued signals and run one after another. Replies run side by side: the thread
pulls each running reply in turn, all of them requests of the pair's one
:class:`~app.engine.decoder.Decoder`, whose rounds they share; results leave as
immutable dataclasses; errors leave as values on ``failed``, each naming the
caller it belongs to (its stage and request id). Starting a reply or a
calibration returns a handle that only its owner holds: its ``cancel()`` sets
that request's own ``threading.Event``, which the engine checks every round,
so there is no stop that reaches another caller's reply. A request cancelled
while it waits is dropped when it reaches the engine, without running.
When MLX runs out of memory the worker drops the pair, gives the memory back
and says so; the app stays up and the pair can be loaded again.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from PySide6.QtCore import QObject, QThread, QThreadPool, Signal, Slot

from app.engine.costs import ProfileStore
from app.engine.decoder import Decoder
from app.engine.generate import (
    PromptTooLongError,
    new_decoder,
    prompt_ids,
    reply_budget,
    stream_reply,
)
from app.engine.loader import LoadProgress, ModelPair, free_memory
from app.engine.observe import BatchStats, Totals
from app.engine.rounds import DraftControl
from app.engine.side_by_side import ROOM
from app.engine.stacked import SLACK
from app.engine.types import (
    Chunk,
    DraftSetting,
    Finished,
    GenerationParams,
    Message,
    Reading,
    Stats,
)
from app.errors import ModelError
from app.hub.fit import request_cache_bytes, usable_memory_bytes
from app.hub.library import human_size
from app.hub.pair_check import load_checked_pair
from app.logs import private
from app.remote import RemoteEngine, check_remote, is_remote_target, stream_remote
from app.services.reply_stream import ReplyStream
from app.services.reply_stream import TokenBatch as TokenBatch  # where callers import it

log = logging.getLogger(__name__)

FLUSH_INTERVAL = 1 / 30  # seconds between UI updates while streaming
LOAD_EVERY = 0.5  # seconds between two reports of the engine's load while replies run
MAX_BATCH = 8  # replies that share rounds at most, unless the memory holds fewer
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
class Prompt:
    """A conversation's prompt tokens, and the loaded pair they were made for.

    ``refused`` says, as a value, why no prompt could be made (too long for the
    window, a broken template); the engine fails the reply with it, unread again.
    """

    pair_id: int
    ids: tuple[int, ...]
    refused: ModelError | None = None


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    request_id: int
    messages: tuple[Message, ...]
    params: GenerationParams
    # The draft setting from the next round on (params' at first); the UI may change it.
    control: DraftControl = field(compare=False)
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)
    shared: bool = False  # a server's request: it runs in the shared batch where it can
    # The messages as prompt_ids gave them for one pair (its ``id``), prepared off the
    # engine thread; used only while that pair is loaded.
    prompt: Prompt | None = None


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What the engine is doing: replies running and waiting, and the batch's totals."""

    active: int = 0
    waiting: int = 0
    batched: int = 0  # of the active, replies in the shared batch
    max_batch: int = MAX_BATCH
    batch: BatchStats = field(default_factory=BatchStats)


@dataclass(frozen=True, slots=True)
class ReplyQueued:
    """A reply waits for a place: ``running`` replies fill the engine's lanes now."""

    request_id: int
    running: int


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
    full: bool = False  # refused for now: the running replies' KV caches fill the memory


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

    def set_drafting(self, setting: DraftSetting) -> None:
        """Changes this reply's draft setting from its next round on."""
        self._request.control.set(setting)


def reply_kv_bytes(
    pair: ModelPair,
    messages: Sequence[Message],
    max_tokens: int,
    batched: bool = False,
    prompt_tokens: int | None = None,
) -> int:
    """The caches one reply may grow to, in both models (0 where it cannot be told): KV
    caches, and a hybrid model's recurrent states (:func:`app.hub.fit.request_cache_bytes`).

    A ``batched`` reply's caches count :data:`~app.engine.stacked.SLACK` times
    more: a round's stacked draft steps copy the draft's, padded, and the
    side-by-side target caches (:mod:`app.engine.side_by_side`) copy the
    target's, padded and :data:`~app.engine.side_by_side.ROOM` columns longer,
    while the reply's own are given back. ``prompt_tokens`` counts the
    prompt where the caller did already.
    """
    target = pair.target
    window = target.context_length
    try:
        # The reply's own bounded rule: a prompt too long for the window is never tokenized whole.
        prompt = (
            prompt_tokens
            if prompt_tokens is not None
            else len(prompt_ids(target.tokenizer, messages, window, target.name))
        )
    except Exception:  # the reply itself says what is wrong with its messages
        return 0
    tokens = prompt + reply_budget(prompt, max_tokens, window)
    stacked = [(tokens + ROOM, SLACK)] if batched else []
    total = 0
    for model, copies in (
        (pair.target, [(tokens, 1), *stacked]),
        (pair.draft, [(tokens, 1 + SLACK if batched else 1)]),
    ):
        if model is None:
            continue
        try:
            drafts = model is pair.draft
            total += sum(n * sum(request_cache_bytes(model.config, t, drafts)) for t, n in copies)
        except ModelError:
            continue
    return total


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
        return memory_fit(Path(request.target), request.draft or None, loaded=in_memory)
    except Exception:  # whatever the estimate trips on, loading says it in one line
        log.debug("no memory estimate for %s", request.target, exc_info=True)
        return None


class EngineWorker(QObject):
    """Lives on the engine thread; every slot runs there."""

    load_progressed = Signal(object)  # LoadProgress
    pair_loaded = Signal(object)  # PairInfo
    calibration_progressed = Signal(object)  # CalibrationProgress
    calibration_finished = Signal(object)  # CalibrationResult, or None when cancelled
    generation_started = Signal(int)
    generation_queued = Signal(object)  # ReplyQueued, once per reply that must wait
    prompt_progressed = Signal(object)  # PromptProgress
    tokens_generated = Signal(object)  # TokenBatch
    generation_finished = Signal(object)  # GenerationResult
    failed = Signal(object)  # EngineFailure
    load_changed = Signal(object)  # EngineLoad

    def __init__(
        self,
        load: LoadFn = load_checked_pair,  # refuses what check-pair refuses
        stream: StreamFn = stream_reply,
        flush_interval: float = FLUSH_INTERVAL,
        check_remote: CheckFn = check_remote,
        stream_remote: RemoteStreamFn = stream_remote,
        profiles: ProfileStore | None = None,
        max_batch: int = MAX_BATCH,
    ) -> None:
        super().__init__()
        self.max_batch = max(1, max_batch)
        # Replies come in here from any thread, so a running line-up can take them in.
        self._inbox: queue.SimpleQueue[GenerateRequest] = queue.SimpleQueue()
        self._waiting: deque[GenerateRequest] = deque()
        self._queued: set[int] = set()  # waiting replies already said to wait
        self._streams: list[ReplyStream] = []
        self._reserved: dict[int, int] = {}  # KV bytes each batched reply may grow to
        self._kv_budget = 0
        self._reported = 0.0
        self._load_now = EngineLoad(max_batch=self.max_batch)
        # Where loaded pairs keep their cost profiles; None: the default data folder.
        self._profiles = profiles
        self._load = load
        self._stream = stream
        self._flush_interval = flush_interval
        self._check_remote = check_remote
        self._stream_remote = stream_remote
        self._pair: ModelPair | None = None
        # The loaded pair's decoder: every reply's caches, kept across turns, its rounds shared.
        self._decoder: Decoder | None = None
        self._totals = Totals()  # its work, from its events: what /metrics serves
        self._remote: RemoteEngine | None = None
        self._info: PairInfo | None = None

    def _set_pair(self, pair: ModelPair | None) -> None:
        """Makes ``pair`` the loaded one, with a decoder of its own (costs in this folder)."""
        self._pair = pair
        self._decoder = new_decoder(pair, self._profiles) if pair is not None else None
        self._totals = Totals()
        if self._decoder is not None:
            self._decoder.subscribe(self._totals)

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

    def submit(self, request: GenerateRequest) -> None:
        """Hands a reply to the engine from any thread; the next round can take it in."""
        self._inbox.put(request)

    def load(self) -> EngineLoad:
        """What the engine is doing now (safe from any thread: an immutable value)."""
        return self._load_now

    @Slot(object)
    def _on_generate_requested(self, _request: GenerateRequest) -> None:
        """Runs every submitted reply until none is left, each pulled in turn.

        Replies submitted meanwhile join between rounds: the signal that woke
        this slot is only a wake-up, the requests come through :meth:`submit`.
        """
        self._take_in()
        while self._streams:
            for stream in list(self._streams):
                self._pump(stream)
            self._take_in()
            self._report()
        self._report(force=True)

    def _take_in(self) -> None:
        """Moves submitted replies to the waiting line, then starts those a lane can take."""
        while not self._inbox.empty():
            self._waiting.append(self._inbox.get())
        waiting, self._waiting = self._waiting, deque()
        for request in waiting:
            if not self._start(request):
                if request.request_id not in self._queued:  # said once, not every round
                    self._queued.add(request.request_id)
                    self.generation_queued.emit(ReplyQueued(request.request_id, len(self._streams)))
                self._waiting.append(request)  # its lane is full: it keeps its place
            else:
                self._queued.discard(request.request_id)

    def _lane(self, request: GenerateRequest) -> Literal["solo", "batch"] | None:
        """Where a reply runs now, if anywhere.

        Every local reply is a request of the pair's one decoder. The window
        has one reply at a time ("solo"), or one counted in the batch's memory
        where the server's replies run already; the server's replies run up to
        ``max_batch`` at once ("batch"), each reserving its KV caches.
        """
        solo_free = not any(not s.shared for s in self._streams)
        batched = sum(s.shared for s in self._streams)
        can_batch = self._decoder is not None
        if not request.shared and solo_free and not (batched and can_batch):
            return "solo"
        if can_batch and batched < self.max_batch:
            return "batch"
        if not can_batch and solo_free:
            return "solo"
        return None

    def _start(self, request: GenerateRequest) -> bool:
        """Starts ``request``, or ends it at once; ``False``: it must wait."""
        rid = request.request_id
        if request.cancel.is_set() and self._info is not None:
            # Withdrawn while it waited: it ends at once, and nothing runs.
            log.debug("reply %d withdrawn before it started", rid)
            finished = Finished(Stats(), "cancelled")
            self.generation_finished.emit(GenerationResult(rid, finished, self._info))
            return True
        if (self._pair is None and self._remote is None) or self._info is None:
            self.failed.emit(EngineFailure(rid, "generate", "No model is loaded."))
            return True
        lane = self._lane(request)
        if lane is None:
            return False
        shared = lane == "batch"
        if shared and not self._reserve(request):
            return True
        last = request.messages[-1].content if request.messages else ""
        log.debug("reply %d to: %s", rid, private(last))
        self.generation_started.emit(rid)
        info = self._info
        try:
            events = self._events(request, shared)
        except ModelError as exc:
            self._fail(rid, exc)
            return True
        self._streams.append(
            ReplyStream(
                rid,
                events,
                self.tokens_generated.emit,
                lambda reading: self.prompt_progressed.emit(PromptProgress(rid, reading)),
                lambda end: self.generation_finished.emit(GenerationResult(rid, end, info)),
                self._flush_interval,
                shared=shared,
            )
        )
        return True

    def _events(
        self, request: GenerateRequest, shared: bool
    ) -> Iterator[Reading | Chunk | Finished]:
        if self._remote is not None:
            return self._stream_remote(
                self._remote, request.messages, request.params, request.cancel
            )
        made = request.prompt
        if made is not None and made.refused is not None and made.pair_id == id(self._pair):
            raise made.refused  # said by _start, as any reply's failure
        prompt = self._prompt_of(request)
        given = {} if prompt is None else {"prompt": prompt}  # the fakes of tests take none
        return self._stream(
            self._pair,
            request.messages,
            request.params,
            request.cancel,
            control=request.control,
            decoder=self._decoder,
            **given,
        )

    def _prompt_of(self, request: GenerateRequest) -> tuple[int, ...] | None:
        """The request's prepared prompt, while the pair it was made for is loaded."""
        prompt = request.prompt
        return prompt.ids if prompt is not None and prompt.pair_id == id(self._pair) else None

    def can_prepare(self) -> bool:
        """Whether a local pair with a tokenizer is loaded, to prepare prompts for."""
        pair = self._pair
        return pair is not None and pair.target.tokenizer is not None

    def prepare(self, messages: Sequence[Message], *, refuse: bool = False) -> Prompt | None:
        """The prompt of ``messages`` for the loaded pair, made on the calling thread.

        Every request is tokenized (its template rendered, its length bounded)
        on a thread other than the engine's, so no request holds up the engine's
        rounds for others; ``None`` where there is no local pair to prepare it for.

        Raises:
            PromptTooLongError: It does not fit the target's window (with ``refuse``,
                a :class:`Prompt` that says so instead, as every ``ModelError``).
            ModelError: A message is not valid text, or the chat template fails.
        """
        pair = self._pair
        if pair is None or pair.target.tokenizer is None:
            return None
        target = pair.target
        try:
            ids = prompt_ids(target.tokenizer, messages, target.context_length, target.name)
        except ModelError as exc:
            if not refuse:
                raise
            return Prompt(id(pair), (), refused=exc)  # why, as a value for the engine
        return Prompt(id(pair), tuple(ids))

    def _reserve(self, request: GenerateRequest) -> bool:
        """Whether the batch's memory holds this reply's KV caches too; says why not."""
        assert self._pair is not None
        prompt = self._prompt_of(request)
        need = reply_kv_bytes(
            self._pair,
            request.messages,
            request.params.max_tokens,
            batched=True,
            prompt_tokens=len(prompt) if prompt is not None else None,
        )
        if not any(s.shared for s in self._streams):
            self._reserved.clear()
            self._kv_budget = usable_memory_bytes()
        held = sum(self._reserved.values())
        if held and held + need > self._kv_budget and self._decoder is not None:
            # Finished requests' caches, kept for follow-up turns, go before a refusal.
            freed = self._decoder.forget()
            if freed:
                free_memory()
                self._kv_budget += freed
        if held and held + need > self._kv_budget:
            message = (
                f"Tandem's memory is full with {len(self._reserved)} running replies "
                f"({human_size(held)} of KV cache, this one needs {human_size(need)} "
                f"of {human_size(self._kv_budget)} usable); try again when one finishes."
            )
            self.failed.emit(EngineFailure(request.request_id, "generate", message, full=True))
            return False
        self._reserved[request.request_id] = need
        return True

    def _pump(self, stream: ReplyStream) -> None:
        """One event of ``stream``; a reply that ended or failed leaves the line-up."""
        try:
            going = stream.pump()
        except Exception as exc:
            going = False
            if not isinstance(exc, ModelError):
                log.exception("generation failed")
            self._fail(stream.request_id, exc)
        if not going and stream in self._streams:  # an unloaded pair clears them all
            self._streams.remove(stream)
            self._reserved.pop(stream.request_id, None)

    def _fail(self, rid: int, exc: Exception) -> None:
        if isinstance(exc, ModelError):  # the pair cannot serve this request; says why
            too_long = isinstance(exc, PromptTooLongError)
            self.failed.emit(EngineFailure(rid, "generate", str(exc), too_long=too_long))
            return
        failure = self._unexpected(exc, "generate", rid, "Generation")
        self.failed.emit(failure)
        if failure.unloaded:  # the pair is gone: so is every reply on it
            for stream in self._streams:
                if stream.request_id != rid:
                    stream.close()
                    self.failed.emit(replace(failure, request_id=stream.request_id))
            self._streams.clear()
            self._reserved.clear()

    def _report(self, force: bool = False) -> None:
        """Publishes the engine's load, at most every :data:`LOAD_EVERY` seconds."""
        now = time.monotonic()
        if not force and now - self._reported < LOAD_EVERY:
            return
        self._reported = now
        batch = self._totals.snapshot(self._decoder.active if self._decoder is not None else 0)
        self._load_now = EngineLoad(
            active=len(self._streams),
            waiting=len(self._waiting) + self._inbox.qsize(),
            batched=sum(s.shared for s in self._streams),
            max_batch=self.max_batch,
            batch=batch,
        )
        self.load_changed.emit(self._load_now)

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
    generation_queued = Signal(object)
    prompt_progressed = Signal(object)
    tokens_generated = Signal(object)
    generation_finished = Signal(object)
    failed = Signal(object)
    load_changed = Signal(object)

    def __init__(self, worker: EngineWorker | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self._ids = itertools.count(1)
        # Requests sent and not yet ended, queued or running, in the order sent.
        self._replies: dict[int, GenerateRequest] = {}
        self._calibrations: dict[int, CalibrateRequest] = {}
        # Prompts made off the engine thread, one at a time so replies keep their order.
        self._preparing = QThreadPool(self)
        self._preparing.setMaxThreadCount(1)
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
        self._worker.generation_queued.connect(self.generation_queued)
        self._worker.prompt_progressed.connect(self.prompt_progressed)
        self._worker.tokens_generated.connect(self.tokens_generated)
        self._worker.generation_finished.connect(self._on_generation_finished)
        self._worker.failed.connect(self._on_failed)
        self._worker.load_changed.connect(self.load_changed)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """Whether any caller's reply or calibration is queued or running."""
        return bool(self._replies or self._calibrations)

    @property
    def calibrating(self) -> bool:
        """Whether a calibration is queued or running (it holds the engine thread)."""
        return bool(self._calibrations)

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

    @property
    def load(self) -> EngineLoad:
        """The engine's load as last reported: replies running and waiting, batch totals."""
        return self._worker.load()

    def generate(
        self,
        messages: Sequence[Message],
        params: GenerationParams,
        *,
        shared: bool = False,
        prompt: Prompt | None = None,
    ) -> ReplyHandle:
        """Starts a reply, or queues it where its lane is full; returns its handle.

        Args:
            shared: A server's request: it runs beside others in the shared
                batch (their target forwards shared) instead of waiting its turn.
            prompt: ``messages`` as :meth:`prepare` made them, so the engine
                thread need not.
        """
        control = DraftControl(params.drafting)
        request = GenerateRequest(
            next(self._ids), tuple(messages), params, control=control, shared=shared, prompt=prompt
        )
        self._replies[request.request_id] = request
        if prompt is None and self._worker.can_prepare():
            # The window's prompt is made on a pool thread, as the server's are on theirs.
            self._preparing.start(lambda: self._submit(self._prepared(request)))
        else:
            self._submit(request)
        return ReplyHandle(request)

    def _prepared(self, request: GenerateRequest) -> GenerateRequest:
        """``request`` with its prompt made here, or why it cannot be made."""
        if request.cancel.is_set():
            return request
        try:
            return replace(request, prompt=self._worker.prepare(request.messages, refuse=True))
        except Exception:  # unexpected: the engine makes the prompt and reports what fails
            return request

    def _submit(self, request: GenerateRequest) -> None:
        """Hands ``request`` to the engine, from any thread."""
        self._worker.submit(request)
        self.generate_requested.emit(request)  # wakes the engine thread if it idles

    def prepare(self, messages: Sequence[Message]) -> Prompt | None:
        """:meth:`EngineWorker.prepare`, on the calling thread (never the GUI's for long)."""
        return self._worker.prepare(messages)

    def shutdown(self, timeout_ms: int = 30_000) -> bool:
        """Stops every caller's work, releases the models on their thread and joins it."""
        if not self._thread.isRunning():
            return True
        for reply in self._replies.values():
            reply.cancel.set()
        self._preparing.waitForDone(timeout_ms)  # none submits after the engine stops
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
