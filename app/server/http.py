"""The aiohttp app of Tandem's OpenAI-compatible server.

It speaks HTTP only; the engine is behind :class:`Backend`, so nothing here
touches MLX or Qt. Routes: ``POST /v1/chat/completions``, ``GET /v1/models``
and ``GET /health``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from app.engine.types import GenerationParams, Message
from app.logs import debug_logging
from app.server.protocol import (
    DONE,
    ChunkStream,
    Event,
    ModelsInfo,
    ReplyFailed,
    ReplyFinished,
    ReplyStarted,
    RequestError,
    TextDelta,
    completion,
    completion_id,
    error_body,
    models_list,
    parse_chat_request,
    sse,
)
from app.server.security import ServerConfig, host_allowed, key_matches, origin_allowed

log = logging.getLogger(__name__)

MAX_BODY = 16 * 1024 * 1024  # a long conversation, not a flood
ALLOWED_HEADERS = "Authorization, Content-Type, OpenAI-Organization, OpenAI-Project"


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BackendUnavailableError(Exception):
    """The engine cannot take a request now (no model, or busy); answered with 503."""


class Backend(Protocol):
    """What the server needs of the engine.

    ``generate`` yields :class:`ReplyStarted` once the engine took the request
    (or raises :class:`BackendUnavailableError` before that), then text deltas and
    one :class:`ReplyFinished` or :class:`ReplyFailed`. Closing the iterator
    early stops the reply.
    """

    def models(self) -> ModelsInfo | None:
        """The loaded pair, or ``None`` when no model is loaded."""
        ...

    def generate(
        self, messages: Sequence[Message], params: GenerationParams
    ) -> AsyncIterator[Event]: ...

    def cancel(self) -> None:
        """Stops the reply in progress, if any."""
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


def _error(error: RequestError) -> web.Response:
    return web.json_response(error_body(error), status=error.status)


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
) -> web.Application:
    """The server's aiohttp application.

    Args:
        backend: The engine behind the server.
        config: Address, API key and CORS origins.
        defaults: Sampling and drafting where a request says nothing.
        on_request: Told of every request once answered (no chat text unless
            ``TANDEM_DEBUG_LOG=1``).
    """

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.monotonic()
        request["tokens"] = 0
        request["prompt"] = ""
        response = await _guarded(request, handler)
        if on_request is not None:
            on_request(
                RequestLog(
                    request.method,
                    request.path,
                    response.status,
                    time.monotonic() - start,
                    request["tokens"],
                    request["prompt"],
                )
            )
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
        return web.json_response(
            {"status": "ok" if models is not None else "no model loaded"},
        )

    async def list_models(request: web.Request) -> web.Response:
        return web.json_response(models_list(backend.models(), int(time.time())))

    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError):
            return _error(RequestError("The request body is not valid JSON."))
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
        request["prompt"] = req.messages[-1].content if debug_logging() else ""
        events = backend.generate(req.messages, req.params)
        finished = False
        try:
            async with contextlib.aclosing(events):  # type: ignore[type-var]
                try:
                    first = await anext(events)
                except BackendUnavailableError as exc:
                    return _error(RequestError(str(exc), status=503, kind="server_error"))
                assert isinstance(first, ReplyStarted)
                if req.stream:
                    response = await _stream(request, events, req.model, req.include_usage)
                else:
                    response = await _whole(request, events, req.model)
                finished = True
                return response
        finally:
            if not finished:  # the client went away, or writing failed
                backend.cancel()

    async def _whole(
        request: web.Request, events: AsyncIterator[Event], model: str
    ) -> web.Response:
        text: list[str] = []
        created = int(time.time())
        async for event in events:
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, ReplyFinished):
                request["tokens"] = event.stats.tokens
                body = completion(completion_id(), created, model, "".join(text), event)
                return web.json_response(body)
            elif isinstance(event, ReplyFailed):
                return _error(RequestError(event.message, status=500, kind="server_error"))
        return _error(RequestError("The reply ended early.", status=500, kind="server_error"))

    async def _stream(
        request: web.Request, events: AsyncIterator[Event], model: str, include_usage: bool
    ) -> web.StreamResponse:
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
        async for event in events:
            if isinstance(event, TextDelta):
                if event.text:
                    await response.write(sse(chunks.content(event.text)))
            elif isinstance(event, ReplyFinished):
                request["tokens"] = event.stats.tokens
                await response.write(sse(chunks.finish(event)))
                if include_usage:
                    await response.write(sse(chunks.usage(event)))
                break
            elif isinstance(event, ReplyFailed):
                failure = RequestError(event.message, status=500, kind="server_error")
                await response.write(sse(error_body(failure)))
                break
        await response.write(DONE)
        await response.write_eof()
        return response

    app = web.Application(middlewares=[guard], client_max_size=MAX_BODY)
    app[BACKEND_KEY] = backend
    app[CONFIG_KEY] = config
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat)
    # Preflights reach the guard through these routes.
    app.router.add_route("OPTIONS", "/v1/models", list_models)
    app.router.add_route("OPTIONS", "/v1/chat/completions", chat)
    app.router.add_route("OPTIONS", "/health", health)
    return app
