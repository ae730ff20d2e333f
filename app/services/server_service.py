"""The Qt bridge of the local server: the server's backend on top of :class:`EngineService`.

Generation stays on the one engine thread: a request calls
``EngineService.generate`` on the GUI thread (the qasync loop runs there) and
the engine's signals feed an ``asyncio.Queue`` that the HTTP handler reads.

One request runs at a time. Server requests wait their turn behind one
another; a request that finds the engine busy with a reply the window asked
for (or a calibration) gets 503 with a message saying so, rather than waiting
an unknown time for the user. A client that disconnects stops its own reply
through that reply's handle; one that gives up while it waits its turn leaves
without touching the reply that runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from app.engine.types import GenerationParams, Message
from app.server.http import BackendUnavailableError, Listener, RequestLog, create_app, listen
from app.server.protocol import (
    Event,
    ModelsInfo,
    ReplyFailed,
    ReplyFinished,
    ReplyStarted,
    TextDelta,
)
from app.server.security import ServerConfig, check_config
from app.services.engine_service import (
    EngineFailure,
    EngineService,
    GenerationResult,
    PairInfo,
    ReplyHandle,
    TokenBatch,
)

log = logging.getLogger(__name__)

BUSY = "Tandem is busy with a reply in its window; try again when it finishes."
NO_MODEL = "No model is loaded in Tandem; load a pair first."


def model_id(path: str) -> str:
    """A model's id as clients see it: its folder name."""
    return Path(path).name or path


class ServerService(QObject):
    """Serves :class:`EngineService` over HTTP on the app's qasync loop.

    Signals:
        request_logged(RequestLog): Each answered request (its ``prompt`` is empty
            unless ``TANDEM_DEBUG_LOG=1``; the window's panel never shows it).
        requests_changed(int): Requests answered since the server started.
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
        self._lock = asyncio.Lock()
        self._queue: asyncio.Queue[Event] | None = None
        self._reply: ReplyHandle | None = None  # the server's reply on the engine
        self._idle = asyncio.Event()
        self._idle.set()
        self._listener: Listener | None = None
        self._url = ""
        self._api_key: str | None = None
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

    async def generate(
        self, messages: Sequence[Message], params: GenerationParams
    ) -> AsyncIterator[Event]:
        async with self._lock:  # server requests take turns
            await self._idle.wait()  # a stopped reply is still winding down
            if self._pair is None:
                raise BackendUnavailableError(NO_MODEL)
            if self._engine.busy:
                raise BackendUnavailableError(BUSY)
            queue: asyncio.Queue[Event] = asyncio.Queue()
            self._queue = queue
            self._idle.clear()
            reply = self._engine.generate(messages, params)
            self._reply = reply
            done = False
            try:
                yield ReplyStarted()
                while not done:
                    event = await queue.get()
                    done = isinstance(event, ReplyFinished | ReplyFailed)
                    yield event
            finally:
                if not done:
                    # This request's own reply, never another's; _idle is set
                    # once the engine says it stopped.
                    reply.cancel()

    @property
    def _running_id(self) -> int | None:
        """The request id of the server's reply on the engine, if any."""
        return self._reply.request_id if self._reply is not None else None

    # Engine signals, on the GUI thread

    @Slot(object)
    def _on_pair_loaded(self, info: PairInfo) -> None:
        self._pair = info

    @Slot(object)
    def _on_tokens_generated(self, batch: TokenBatch) -> None:
        if batch.request_id == self._running_id and self._queue is not None:
            self._queue.put_nowait(TextDelta(batch.text))

    @Slot(object)
    def _on_generation_finished(self, result: GenerationResult) -> None:
        if result.request_id == self._running_id:
            self._end(ReplyFinished(result.finished.finish_reason, result.finished.stats))

    @Slot(object)
    def _on_failed(self, failure: EngineFailure) -> None:
        if failure.unloaded:  # out of memory: the engine dropped the pair
            self._pair = None
        if failure.stage == "generate" and failure.request_id == self._running_id:
            if failure.too_long:  # the caller's doing: 400, as OpenAI answers it
                self._end(ReplyFailed(failure.message, 400, "context_length_exceeded"))
            else:
                self._end(ReplyFailed(failure.message))

    def _end(self, event: Event) -> None:
        if self._queue is not None:
            self._queue.put_nowait(event)
        self._queue = None
        self._reply = None
        self._idle.set()

    # Listening

    async def start(self, config: ServerConfig) -> str:
        """Starts listening; returns the base URL.

        Raises:
            ServerConfigError: The configuration is refused (see :func:`check_config`).
            OSError: The address cannot be bound (say, the port is taken).
        """
        check_config(config)
        await self.stop()
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
        if self._reply is not None:  # the server's own reply; the window's runs on
            self._reply.cancel()
        await listener.close()
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


def serve_headless(
    config: ServerConfig,
    target: str,
    draft: str | None,
    *,
    defaults: Callable[[], GenerationParams] = GenerationParams,
    announce: Callable[[str], None] = print,
) -> int:
    """Loads a pair and serves it without a window until SIGINT or SIGTERM.

    Runs a ``QCoreApplication`` on a qasync loop; the engine thread is stopped
    and joined before this returns.

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
    engine = EngineService()
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
            print(f"tandem: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
            return 2
        announce(url)
        await stop.wait()
        await server.stop()
        return 0

    try:
        with loop:
            code = loop.run_until_complete(run())
    finally:
        ticker.stop()
        engine.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code
