"""The Qt bridge of the local server: the server's backend on top of :class:`EngineService`.

Generation stays on the one engine thread: a request calls
``EngineService.generate`` on the GUI thread (the qasync loop runs there) and
the engine's signals feed an ``asyncio.Queue`` that the HTTP handler reads.

Requests run side by side: the engine verifies the drafts of up to its batch
size of them in one target forward, and the window's own reply takes part as
one more. A request beyond the batch size waits its turn; one whose KV caches
the memory cannot hold beside the running ones gets 429. A client that
disconnects stops its own reply through that reply's handle; one that gives up
while it waits leaves without touching the replies that run. A reply cut by the
server stopping (or the engine shutting down) fails with 503, never passing for a
whole reply.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from app.engine.generate import PromptTooLongError
from app.engine.types import GenerationParams, Message
from app.errors import ModelError
from app.server.http import (
    BackendUnavailableError,
    Listener,
    RequestLog,
    cannot_listen,
    create_app,
    listen,
)
from app.server.protocol import (
    Event,
    Metrics,
    ModelsInfo,
    ReplyFailed,
    ReplyFinished,
    ReplyStarted,
    TextDelta,
)
from app.server.security import ServerConfig, check_config
from app.services.engine_service import (
    MAX_BATCH,
    EngineFailure,
    EngineService,
    EngineWorker,
    GenerationResult,
    PairInfo,
    ReplyHandle,
    TokenBatch,
)

log = logging.getLogger(__name__)

NO_MODEL = "No model is loaded in Tandem; load a pair first."
SHUTTING_DOWN = "Tandem is shutting down; the reply was cut."


def model_id(path: str) -> str:
    """A model's id as clients see it: its folder name."""
    return Path(path).name or path


class ServerService(QObject):
    """Serves :class:`EngineService` over HTTP on the app's qasync loop.

    Signals:
        request_logged(RequestLog): Each answered request (its ``prompt`` is empty
            unless ``TANDEM_DEBUG_LOG=1``; the window's panel never shows it).
        requests_changed(int): Requests answered since the server started; also
            emitted when a request starts or ends (see :attr:`in_progress`).
        running_changed(str): The base URL once listening; empty once stopped.
    """

    request_logged = Signal(object)
    requests_changed = Signal(int)
    running_changed = Signal(str)

    def __init__(
        self,
        engine: EngineService,
        defaults: Callable[[], GenerationParams] = GenerationParams,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._engine = engine
        self._defaults = defaults
        self._pair: PairInfo | None = None
        # Each running request's events, by its reply's id on the engine.
        self._queues: dict[int, asyncio.Queue[Event]] = {}
        self._replies: dict[int, ReplyHandle] = {}
        self._listener: Listener | None = None
        self._url = ""
        self._api_key: str | None = None
        self._stopping = False
        self.request_count = 0
        engine.pair_loaded.connect(self._on_pair_loaded)
        engine.tokens_generated.connect(self._on_tokens_generated)
        engine.generation_finished.connect(self._on_generation_finished)
        engine.failed.connect(self._on_failed)

    @property
    def url(self) -> str:
        """The base URL while running, else empty."""
        return self._url

    @property
    def in_progress(self) -> int:
        """Requests the engine runs or queues for the server now."""
        return len(self._replies)

    @property
    def api_key(self) -> str | None:
        """The key clients must send while running; ``None`` for none (or stopped)."""
        return self._api_key

    # Backend

    def models(self) -> ModelsInfo | None:
        if self._pair is None:
            return None
        draft = self._pair.draft
        return ModelsInfo(
            model_id(self._pair.target),
            model_id(draft) if draft else None,
            (draft,) if draft else (),
        )

    def metrics(self) -> Metrics:
        """The engine's load: requests running and waiting, the batch's acceptance."""
        load = self._engine.load
        return Metrics(load.active, load.waiting, load.batched, load.max_batch, load.batch)

    async def generate(
        self, messages: Sequence[Message], params: GenerationParams
    ) -> AsyncIterator[Event]:
        if self._pair is None:
            raise BackendUnavailableError(NO_MODEL)
        if self._stopping:
            raise BackendUnavailableError(SHUTTING_DOWN)
        # Rendered, bounded and tokenized on a thread of its own: a long or hostile
        # prompt holds up neither the engine's rounds for others nor this loop.
        try:
            prompt = await asyncio.to_thread(self._engine.prepare, messages)
        except ModelError as exc:
            yield ReplyStarted()
            yield _refusal(str(exc), too_long=isinstance(exc, PromptTooLongError))
            return
        queue: asyncio.Queue[Event] = asyncio.Queue()
        reply = self._engine.generate(messages, params, shared=True, prompt=prompt)
        rid = reply.request_id
        self._queues[rid] = queue
        self._replies[rid] = reply
        self.requests_changed.emit(self.request_count)
        done = False
        try:
            yield ReplyStarted()
            while not done:
                event = await queue.get()
                done = isinstance(event, ReplyFinished | ReplyFailed)
                yield event
        finally:
            self._queues.pop(rid, None)
            if self._replies.pop(rid, None) is not None:
                self.requests_changed.emit(self.request_count)
            if not done:
                reply.cancel()  # this request's own reply, never another's

    # Engine signals, on the GUI thread

    @Slot(object)
    def _on_pair_loaded(self, info: PairInfo) -> None:
        self._pair = info

    @Slot(object)
    def _on_tokens_generated(self, batch: TokenBatch) -> None:
        queue = self._queues.get(batch.request_id)
        if queue is not None:
            queue.put_nowait(TextDelta(batch.text, len(batch.token_ids), batch.prompt_tokens))

    @Slot(object)
    def _on_generation_finished(self, result: GenerationResult) -> None:
        finished = result.finished
        if finished.finish_reason == "cancelled":
            # Only the server cancels its replies: one that still has a listener was
            # cut by a stop or by the engine shutting down, not ended by the model.
            self._end(result.request_id, _cut())
            return
        self._end(result.request_id, ReplyFinished(finished.finish_reason, finished.stats))

    @Slot(object)
    def _on_failed(self, failure: EngineFailure) -> None:
        if failure.unloaded:  # out of memory: the engine dropped the pair
            self._pair = None
        if failure.stage != "generate" or failure.request_id is None:
            return
        message = failure.message
        self._end(failure.request_id, _refusal(message, failure.too_long, failure.full))

    def _end(self, rid: int, event: Event) -> None:
        queue = self._queues.pop(rid, None)
        if self._replies.pop(rid, None) is not None:
            self.requests_changed.emit(self.request_count)
        if queue is not None:
            queue.put_nowait(event)

    # Listening

    async def start(self, config: ServerConfig) -> str:
        """Starts listening; returns the base URL.

        Raises:
            ServerConfigError: The configuration is refused (see :func:`check_config`).
            OSError: The address cannot be bound (say, the port is taken).
        """
        check_config(config)
        await self.stop()
        self._stopping = False
        app = create_app(self, config, defaults=self._defaults, on_request=self._on_request)
        listener = await listen(app, config.host, config.port)
        self._listener = listener
        port = listener.port  # the port chosen when config.port is 0
        self._url = config.url(port)
        self._api_key = config.api_key or None
        self.request_count = 0
        log.info("server listening on %s", self._url)
        self.running_changed.emit(self._url)
        return self._url

    async def stop(self) -> None:
        """Stops listening and any reply the server asked for."""
        if self._listener is None:
            return
        listener, self._listener = self._listener, None
        self._stopping = True  # a request still arriving on an open connection gets 503
        for rid, reply in list(self._replies.items()):  # the server's own; the window's runs on
            reply.cancel()
            self._end(rid, _cut())  # running or queued, its client hears it was cut
        await listener.close()  # after the handlers have answered, within aiohttp's timeout
        self._url = ""
        self._api_key = None
        log.info("server stopped")
        self.running_changed.emit("")

    def _on_request(self, entry: RequestLog) -> None:
        self.request_count += 1
        line = entry.line()
        log.info("server: %s", line)
        self.request_logged.emit(entry)
        self.requests_changed.emit(self.request_count)


def _refusal(message: str, too_long: bool = False, full: bool = False) -> ReplyFailed:
    """A reply the engine cannot give, as the client hears it."""
    if too_long:  # the caller's doing: 400, as OpenAI answers it
        return ReplyFailed(message, 400, "context_length_exceeded")
    if full:  # the running replies fill the memory: try again later
        return ReplyFailed(message, 429, "server_full")
    return ReplyFailed(message)


def _cut() -> ReplyFailed:
    return ReplyFailed(SHUTTING_DOWN, 503, "server_shutting_down")


def serve_headless(
    config: ServerConfig,
    target: str,
    draft: str | None,
    *,
    defaults: Callable[[], GenerationParams] = GenerationParams,
    announce: Callable[[str], None] = print,
    parallel: int = MAX_BATCH,
) -> int:
    """Loads a pair and serves it without a window until SIGINT or SIGTERM.

    Runs a ``QCoreApplication`` on a qasync loop; the engine thread is stopped
    and joined before this returns.

    Args:
        parallel: Requests whose rounds share one target forward, at most.

    Returns:
        0 after a clean stop, 1 when the pair cannot be loaded, 2 when the
        address cannot be bound.
    """
    import signal
    import sys

    import qasync
    from PySide6.QtCore import QCoreApplication, QTimer

    app = QCoreApplication.instance() or QCoreApplication([sys.argv[0]])
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    engine = EngineService(EngineWorker(max_batch=parallel))
    server = ServerService(engine, defaults)
    stop = asyncio.Event()

    def on_signal(*_: object) -> None:
        loop.call_soon_threadsafe(stop.set)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    # Python runs signal handlers only when it gets control; Qt's loop must hand it back.
    ticker = QTimer()
    ticker.timeout.connect(lambda: None)
    ticker.start(200)

    async def run() -> int:
        loaded: asyncio.Future[str | None] = loop.create_future()

        def on_loaded(_info: PairInfo) -> None:
            if not loaded.done():
                loaded.set_result(None)

        def on_failed(failure: EngineFailure) -> None:
            if failure.stage == "load" and not loaded.done():
                loaded.set_result(failure.message)

        engine.pair_loaded.connect(on_loaded)
        engine.failed.connect(on_failed)
        engine.load_pair(target, draft)
        stopping: asyncio.Future[bool] = asyncio.ensure_future(stop.wait())
        done: set[asyncio.Future[object]] = {loaded, stopping}  # type: ignore[arg-type]
        await asyncio.wait(done, return_when=asyncio.FIRST_COMPLETED)
        if not loaded.done():
            return 0  # stopped while loading
        stopping.cancel()
        problem = loaded.result()
        if problem is not None:
            print(f"tandem: {problem}", file=sys.stderr)
            return 1
        try:
            url = await server.start(config)
        except OSError as exc:
            print(f"tandem: {cannot_listen(config.host, config.port, exc)}", file=sys.stderr)
            return 2
        announce(url)
        await stop.wait()
        await server.stop()
        return 0

    try:
        with loop:
            code: int = loop.run_until_complete(run())
    finally:
        ticker.stop()
        engine.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code
