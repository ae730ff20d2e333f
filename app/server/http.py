"""The aiohttp app of Tandem's OpenAI-compatible server.

It speaks HTTP only; the engine is behind :class:`Backend`, so nothing here
touches MLX or Qt. Routes: ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health`` and ``GET /metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from app.engine.types import GenerationParams, Message
from app.logs import BurstFilter, debug_logging, hide_secret, private
from app.server.protocol import (
    DONE,
    ChunkStream,
    Event,
    Metrics,
    ModelsInfo,
    ReplyFailed,
    ReplyFinished,
    ReplyStarted,
    RequestError,
    TextDelta,
    completion,
    completion_id,
    error_body,
    metrics_text,
    models_list,
    parse_chat_request,
    sse,
)
from app.server.security import ServerConfig, host_allowed, key_matches, origin_allowed
from app.server.stops import until_stop

log = logging.getLogger(__name__)

MAX_BODY = 16 * 1024 * 1024  # a long conversation, not a flood
HEADER_TIMEOUT = 15.0  # seconds a connection may take to send its headers, or stay idle
READ_TIMEOUT = 60.0  # seconds a request's body may take to arrive
MAX_CONNECTIONS = 128  # open connections at once; more are answered 503 and closed

# aiohttp's own complaints about connections (unparsable requests, headers that
# quote the key): one line per burst, no traceback, through the secret filter.
connection_log = logging.getLogger(f"{__name__}.connections")
connection_log.addFilter(BurstFilter())
ALLOWED_HEADERS = "Authorization, Content-Type, OpenAI-Organization, OpenAI-Project"
CLIENT_CLOSED = 499  # the request log's status for a client that left before its answer


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BackendUnavailableError(Exception):
    """The engine cannot take a request now (no model, or busy); answered with 503."""


class Backend(Protocol):
    """What the server needs of the engine.

    ``generate`` yields :class:`ReplyStarted` once the engine took the request
    (or raises :class:`BackendUnavailableError` before that), then text deltas and
    one :class:`ReplyFinished` or :class:`ReplyFailed`. Closing the iterator
    early, or cancelling the task that awaits it, stops that request's reply
    only, or withdraws the request while it waits; there is no stop that
    reaches another request.
    """

    def models(self) -> ModelsInfo | None:
        """The loaded pair, or ``None`` when no model is loaded."""
        ...

    def generate(
        self, messages: Sequence[Message], params: GenerationParams
    ) -> AsyncIterator[Event]: ...

    def metrics(self) -> Metrics:
        """Requests running and waiting, and the batch's totals."""
        ...


@dataclass(frozen=True, slots=True)
class RequestLog:
    """One served request, for the window's log. ``prompt`` is empty unless debug logging."""

    method: str
    path: str
    status: int
    seconds: float
    tokens: int = 0
    prompt: str = ""

    def line(self) -> str:
        text = f"{self.method} {self.path} {self.status} {self.seconds * 1000:.0f} ms"
        if self.tokens:
            text += f", {self.tokens} tokens"
        if self.prompt:
            text += f": {self.prompt}"
        return text


BACKEND_KEY = web.AppKey("backend", object)
CONFIG_KEY = web.AppKey("config", ServerConfig)
# What a request's log line reports: tokens it produced, its prompt where debug logging is on.
TOKENS_KEY = web.RequestKey("tokens", int)
PROMPT_KEY = web.RequestKey("prompt", str)


def _error(error: RequestError) -> web.Response:
    return web.json_response(error_body(error), status=error.status)


def _failure(event: ReplyFailed) -> RequestError:
    kind = "invalid_request_error" if event.status < 500 else "server_error"
    return RequestError(event.message, status=event.status, kind=kind, code=event.code)


async def _json_body(request: web.Request) -> object:
    """The request's JSON body, read within :data:`READ_TIMEOUT`.

    Raises:
        RequestError: It is late (408), not UTF-8, not JSON, or nested too deep (400).
    """
    try:
        async with asyncio.timeout(READ_TIMEOUT):
            raw = await request.read()
    except TimeoutError:
        raise RequestError(
            f"The request body did not arrive within {READ_TIMEOUT:g} seconds.", status=408
        ) from None
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise RequestError("The request body is not valid UTF-8.") from None
    except RecursionError:
        raise RequestError("The request body is nested too deeply.") from None
    except ValueError:
        raise RequestError("The request body is not valid JSON.") from None


def _cors_headers(origin: str) -> dict[str, str]:
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
        "Access-Control-Allow-Headers": ALLOWED_HEADERS,
        "Access-Control-Max-Age": "600",
        "Vary": "Origin",
    }


def create_app(
    backend: Backend,
    config: ServerConfig,
    *,
    defaults: Callable[[], GenerationParams] = GenerationParams,
    on_request: Callable[[RequestLog], None] | None = None,
    header_timeout: float = HEADER_TIMEOUT,
) -> web.Application:
    """The server's aiohttp application.

    Args:
        backend: The engine behind the server.
        config: Address, API key and CORS origins.
        defaults: Sampling and drafting where a request says nothing.
        on_request: Told of every request once answered (no chat text unless
            ``TANDEM_DEBUG_LOG=1``).
        header_timeout: Seconds a connection may take to send its headers or
            stay idle between requests.
    """

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.monotonic()
        request[TOKENS_KEY] = 0
        request[PROMPT_KEY] = ""

        def record(status: int) -> None:
            if on_request is not None:
                on_request(
                    RequestLog(
                        request.method,
                        request.path,
                        status,
                        time.monotonic() - start,
                        request[TOKENS_KEY],
                        request[PROMPT_KEY],
                    )
                )

        try:
            response = await _guarded(request, handler)
        except asyncio.CancelledError:  # the client left, even while waiting its turn
            record(CLIENT_CLOSED)
            raise
        except Exception as exc:  # a bug: logged once, answered as JSON where still possible
            log.error("%s %s failed: %s", request.method, request.path, type(exc).__name__)
            log.debug("the failure's traceback", exc_info=True)
            record(500)
            if request.writer.output_size > 0:  # a stream already begun cannot change status
                raise
            failure = "Tandem failed to answer; see its log."
            return _error(RequestError(failure, status=500, kind="server_error"))
        record(response.status)
        return response

    async def _guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not host_allowed(request.headers.get("Host"), config):
            return _error(
                RequestError(
                    "Host not allowed: this server answers only to localhost.",
                    status=403,
                    kind="permission_error",
                )
            )
        origin = request.headers.get("Origin")
        cors: dict[str, str] = {}
        if origin is not None:
            if not origin_allowed(origin, config):
                return _error(
                    RequestError(
                        f"Origin {origin} is not allowed; add it to the server's CORS origins.",
                        status=403,
                        kind="permission_error",
                    )
                )
            cors = _cors_headers(origin)
        if request.method == "OPTIONS":  # a preflight needs no key
            return web.Response(status=204, headers=cors)
        if request.path != "/health" and not key_matches(
            request.headers.get("Authorization"), config.api_key
        ):
            response: web.StreamResponse = _error(
                RequestError(
                    "Incorrect or missing API key.",
                    status=401,
                    kind="invalid_request_error",
                    code="invalid_api_key",
                )
            )
        elif (request.content_length or 0) > MAX_BODY:  # refused before reading it
            response = _error(
                RequestError(
                    f"The request body is over the limit of {MAX_BODY // (1024 * 1024)} MB.",
                    status=413,
                )
            )
        else:
            try:
                response = await handler(request)
            except web.HTTPException as exc:  # unknown routes and methods, as JSON
                response = _error(RequestError(exc.reason, status=exc.status))
        if cors and not response.prepared:
            response.headers.update(cors)
        return response

    async def health(request: web.Request) -> web.Response:
        models = backend.models()
        m = backend.metrics()
        return web.json_response(
            {
                "status": "ok" if models is not None else "no model loaded",
                "requests_running": m.active,
                "requests_waiting": m.waiting,
                "batch_acceptance": m.batch.acceptance,
            },
        )

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            text=metrics_text(backend.metrics()), content_type="text/plain", charset="utf-8"
        )

    async def list_models(request: web.Request) -> web.Response:
        return web.json_response(models_list(backend.models(), int(time.time())))

    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
        except RequestError as exc:
            return _error(exc)
        models = backend.models()
        if models is None:
            return _error(
                RequestError(
                    "No model is loaded in Tandem; load a pair first.",
                    status=503,
                    kind="server_error",
                )
            )
        try:
            req = parse_chat_request(body, models, defaults())
        except RequestError as exc:
            return _error(exc)
        request[PROMPT_KEY] = private(req.messages[-1].content) if debug_logging() else ""
        events = backend.generate(req.messages, req.params)
        # Closing the events, as this block does however it ends (a client gone
        # while waiting or streaming, a failed write), stops this request's
        # reply alone; nothing here may stop the engine for everyone.
        async with contextlib.aclosing(events):  # type: ignore[type-var]
            try:
                first = await anext(events)
            except BackendUnavailableError as exc:
                return _error(RequestError(str(exc), status=503, kind="server_error"))
            assert isinstance(first, ReplyStarted)
            # Ends at a stop string; leaving this block then stops the reply.
            replies = until_stop(events, req.stop)
            async with contextlib.aclosing(replies):  # type: ignore[type-var]
                if req.stream:
                    return await _stream(request, replies, req.model, req.include_usage)
                return await _whole(request, replies, req.model)

    async def _whole(
        request: web.Request, events: AsyncIterator[Event], model: str
    ) -> web.Response:
        text: list[str] = []
        created = int(time.time())
        async for event in events:
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, ReplyFinished):
                request[TOKENS_KEY] = event.stats.tokens
                body = completion(completion_id(), created, model, "".join(text), event)
                return web.json_response(body)
            elif isinstance(event, ReplyFailed):
                return _error(_failure(event))
        return _error(RequestError("The reply ended early.", status=500, kind="server_error"))

    async def _stream(
        request: web.Request, events: AsyncIterator[Event], model: str, include_usage: bool
    ) -> web.StreamResponse:
        # Headers wait for the first event, so a request the engine refuses before
        # any text (a conversation longer than the window) gets its status, not a 200.
        first = await anext(events, None)
        if isinstance(first, ReplyFailed):
            return _error(_failure(first))
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        origin = request.headers.get("Origin")
        if origin is not None:
            response.headers.update(_cors_headers(origin))
        await response.prepare(request)
        chunks = ChunkStream(model, include_usage)
        await response.write(sse(chunks.role()))
        event: Event | None = first
        while event is not None:
            if isinstance(event, TextDelta):
                if event.text:
                    await response.write(sse(chunks.content(event.text)))
            elif isinstance(event, ReplyFinished):
                request[TOKENS_KEY] = event.stats.tokens
                await response.write(sse(chunks.finish(event)))
                if include_usage:
                    await response.write(sse(chunks.usage(event)))
                break
            elif isinstance(event, ReplyFailed):
                await response.write(sse(error_body(_failure(event))))
                break
            event = await anext(events, None)
        await response.write(DONE)
        await response.write_eof()
        return response

    hide_secret(config.api_key)
    app = web.Application(
        middlewares=[guard],
        client_max_size=MAX_BODY,
        # aiohttp closes a connection whose headers have not come (or that sat idle)
        # after the keep-alive timeout, counted from the moment it opened.
        handler_args={"keepalive_timeout": header_timeout, "logger": connection_log},
    )
    app[BACKEND_KEY] = backend
    app[CONFIG_KEY] = config
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat)
    # Preflights reach the guard through these routes.
    app.router.add_route("OPTIONS", "/v1/models", list_models)
    app.router.add_route("OPTIONS", "/v1/chat/completions", chat)
    app.router.add_route("OPTIONS", "/health", health)
    app.router.add_route("OPTIONS", "/metrics", metrics)
    return app


_BUSY_BODY = json.dumps(
    error_body(
        RequestError(
            "Too many open connections to Tandem; try again shortly.",
            status=503,
            kind="server_error",
        )
    )
).encode()
_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n"
) + _BUSY_BODY


class _ApiRequestHandler(RequestHandler):
    """aiohttp's connection handler, answering what it cannot parse the API's way.

    A request aiohttp cannot parse never reaches the app. One whose
    ``Authorization`` header is malformed (a NUL byte, say) gets 401 as any
    wrong key does; anything else gets a JSON 400. Neither echoes the request.
    """

    __slots__ = ()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status != 400 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        connection_log.warning("an unparsable request: %s", exc)  # scrubbed, one per burst
        if "authorization" in str(exc).lower():
            error = RequestError(
                "Incorrect or missing API key.",
                status=401,
                kind="invalid_request_error",
                code="invalid_api_key",
            )
        else:
            error = RequestError("The request is not valid HTTP.")
        response = _error(error)
        response.force_close()
        return response


class _Refuse(asyncio.Protocol):
    """A connection over the limit: answered 503 at once and closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_BUSY_RESPONSE)
        transport.close()


@dataclass(slots=True)
class Listener:
    """The app listening on a socket; :meth:`close` stops it and its connections."""

    runner: web.AppRunner
    server: asyncio.Server
    port: int

    async def close(self) -> None:
        self.server.close()  # no new connections; then aiohttp closes the open ones
        await self.runner.cleanup()
        await self.server.wait_closed()


def check_address(host: str, port: int) -> None:
    """Binds ``host:port`` as :func:`listen` would and lets go at once, binding nothing.

    Lets a caller refuse a taken port before slow work (loading a pair); a
    port taken in between still fails in :func:`listen`.

    Raises:
        OSError: The address cannot be bound (say, the port is taken).
    """
    if port == 0:
        return  # a free one is picked
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    for family, kind, proto, _, address in dict.fromkeys(infos):
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:
            continue  # a family this machine lacks; asyncio skips it too
        with sock:
            # The options asyncio's create_server sets, so both agree on what is taken.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)


def cannot_listen(host: str, port: int, exc: OSError) -> str:
    """The one line said when ``host:port`` cannot be bound."""
    return f"cannot listen on {host}:{port}: {exc}"


async def listen(
    app: web.Application, host: str, port: int, *, max_connections: int = MAX_CONNECTIONS
) -> Listener:
    """Serves ``app`` on ``host:port`` with at most ``max_connections`` open at once.

    A connection over the limit is answered 503 and closed (one log line per
    burst), so a flood of idle connections cannot use up the open-file limit;
    with the app's header timeout they also cannot linger.

    Raises:
        OSError: The address cannot be bound (say, the port is taken).
    """
    # Cancel a handler when its client disconnects, so the reply stops.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    handlers = runner.server
    assert handlers is not None

    def connection() -> asyncio.BaseProtocol:
        if len(handlers.connections) >= max_connections:
            connection_log.warning(
                "refusing a connection: %d are open, the most the server takes", max_connections
            )
            return _Refuse()
        # As handlers() builds it, with the API's answers to unparsable requests
        # (aiohttp's own handler where its private arguments are not there).
        kwargs = getattr(handlers, "_kwargs", None)
        if not isinstance(kwargs, dict):
            return handlers()
        return _ApiRequestHandler(handlers, loop=asyncio.get_running_loop(), **kwargs)

    try:
        server = await asyncio.get_running_loop().create_server(connection, host, port)
    except BaseException:
        await runner.cleanup()
        raise
    return Listener(runner, server, server.sockets[0].getsockname()[1])
