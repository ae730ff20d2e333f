"""Streams a reply from a remote OpenAI-compatible server, as local generation would.

The stream runs synchronously on the caller's thread (the engine thread in the app):
it is I/O only, and cancellation is checked between server-sent events. Every
failure leaves as a :class:`ModelError` with a one-line message.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx

from app.engine.types import (
    Chunk,
    Finished,
    FinishReason,
    GenerationParams,
    Message,
    Origin,
    Stats,
)
from app.errors import ModelError
from app.remote import stats as adapters
from app.remote.stats import NOT_REPORTED, SERVER_KINDS, ServerKind, SpecReport

REMOTE_TOKEN = -1
"""The pseudo token id of one streamed text delta: remote servers send text, not ids."""
CHECK_TIMEOUT = 3.0  # seconds for the reachability check when loading
STREAM_TIMEOUT = 120.0  # seconds without a byte before a reply is given up
_METRICS_TIMEOUT = 2.0
_SCHEMES = ("http://", "https://")
OPENAI_CHAT = "/v1/chat/completions"
LMSTUDIO_CHAT = "/api/v0/chat/completions"
"""LM Studio's native REST API (beta): same body and SSE framing, plus a ``stats`` object."""


def is_remote_target(target: str) -> bool:
    """Whether a load target names a remote server rather than a model folder."""
    return target.strip().lower().startswith(_SCHEMES)


def target_text(target: str) -> str:
    """A load target as a field shows it: a folder as it is, a remote engine as its URL.

    The kind and models that :meth:`RemoteEngine.to_target` keeps in the
    fragment are Tandem's own encoding, never shown.
    """
    target = target.strip()
    return target.split("#", 1)[0] if is_remote_target(target) else target


def target_name(target: str) -> str:
    """A short name of a load target: a folder's name, a remote engine's ``host:port``."""
    if not is_remote_target(target):
        return Path(target.strip()).name or target.strip()
    return urlsplit(target_text(target)).netloc or target_text(target)


def target_tooltip(target: str) -> str:
    """What a field showing ``target`` says on hover: the folder, or the engine in words."""
    if not is_remote_target(target):
        return target.strip()
    try:
        return RemoteEngine.from_target(target).label
    except ValueError:  # a URL typed by hand that is not one yet
        return target_text(target)


def normalize_url(url: str) -> str:
    """The server's base URL: no fragment, query, trailing slash or trailing ``/v1``.

    Raises:
        ValueError: ``url`` is not an http(s) address with a host.
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) server address: {url.strip()[:80]!r}")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"


@dataclass(frozen=True, slots=True)
class RemoteEngine:
    """A server that generates for Tandem. Its key lives in the keychain, never here.

    Attributes:
        url: Base URL, such as ``http://studio.local:8080`` (normalized).
        kind: Which server it is; decides the request extras and the stats adapter.
        model: The model name sent with each request; empty sends none.
        draft_model: A draft the server loads per request (mlx_lm.server, LM Studio).
    """

    url: str
    kind: ServerKind = "openai-compatible"
    model: str = ""
    draft_model: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", normalize_url(self.url))
        if self.kind not in SERVER_KINDS:
            raise ValueError(f"unknown server kind: {self.kind!r}")

    @property
    def host(self) -> str:
        """``host:port`` of the server, for labels."""
        return urlsplit(self.url).netloc

    @property
    def label(self) -> str:
        return f"remote: {self.model or self.kind} @ {self.host}"

    def to_target(self) -> str:
        """The engine as one load target string: the URL, with the rest in its fragment.

        A fragment is never sent to the server, and the string fits everywhere a
        model folder goes (``pair_chosen``, the last-pair setting).
        """
        extras = {"kind": self.kind, "model": self.model, "draft": self.draft_model}
        return f"{self.url}#{urlencode({k: v for k, v in extras.items() if v})}"

    @classmethod
    def from_target(cls, target: str) -> RemoteEngine:
        """Reads a target made by :meth:`to_target` (or a bare URL).

        Raises:
            ValueError: Not an http(s) address, or an unknown kind.
        """
        fragment = urlsplit(target.strip()).fragment
        extras = dict(parse_qsl(fragment))
        kind = extras.get("kind", "openai-compatible")
        if kind not in SERVER_KINDS:
            raise ValueError(f"unknown server kind: {kind!r}")
        return cls(target, kind, extras.get("model", ""), extras.get("draft", ""))


def _headers(key: str | None) -> dict[str, str]:
    from app.logs import hide_secret

    hide_secret(key)  # a key sent anywhere is in no log record from then on
    return {"Authorization": f"Bearer {key}"} if key else {}


def _stored_key(url: str) -> str | None:
    from app.keychain import stored_remote_key

    return stored_remote_key(url)


def _transport_error(exc: httpx.HTTPError, engine: RemoteEngine, timeout: float) -> ModelError:
    """One line for a failure below HTTP: refused, unreachable, too slow or cut off."""
    if isinstance(exc, httpx.TimeoutException):
        return ModelError(f"{engine.url} did not answer within {timeout:g} s")
    if isinstance(exc, httpx.ConnectError):
        text = str(exc).lower()
        if "refused" in text:
            return ModelError(f"cannot reach {engine.url}: connection refused")
        if "name" in text or "resolve" in text or "nodename" in text:
            return ModelError(f"cannot reach {engine.url}: unknown host")
        return ModelError(f"cannot reach {engine.url}: {_first_line(str(exc)) or 'no connection'}")
    reason = _first_line(str(exc)) or type(exc).__name__
    return ModelError(f"the connection to {engine.url} broke: {reason}")


def _first_line(text: str, limit: int = 160) -> str:
    lines = text.strip().splitlines()
    return lines[0][:limit] if lines else ""


def _status_error(response: httpx.Response, engine: RemoteEngine, body: bytes) -> ModelError:
    """One line for an HTTP error status, with the server's own message when it has one."""
    code = response.status_code
    if code in (401, 403):
        return ModelError(f"the server refused the key (HTTP {code})")
    if code == 404:
        return ModelError(f"{response.request.url} was not found (HTTP 404): check the address")
    detail = ""
    try:
        data = json.loads(body)
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict):
            detail = str(error.get("message", ""))
        elif error:
            detail = str(error)
    except ValueError:
        detail = body.decode("utf-8", "replace")
    detail = _first_line(detail)
    return ModelError(f"{engine.host} answered HTTP {code}" + (f": {detail}" if detail else ""))


def check_remote(
    engine: RemoteEngine, *, key: str | None = None, timeout: float = CHECK_TIMEOUT
) -> None:
    """Checks that the server answers ``GET /v1/models`` (or ``/health``).

    Raises:
        ModelError: Unreachable, refused the key, or no OpenAI-compatible server there.
    """
    if key is None:
        key = _stored_key(engine.url)
    try:
        with httpx.Client(timeout=timeout, headers=_headers(key)) as client:
            for path in ("/v1/models", "/health"):
                response = client.get(engine.url + path)
                if response.status_code == 404:
                    continue
                if response.is_success:
                    return
                raise _status_error(response, engine, response.content)
    except httpx.HTTPError as exc:
        raise _transport_error(exc, engine, timeout) from None
    raise ModelError(
        f"{engine.url} has no /v1/models or /health: is it an OpenAI-compatible server?"
    )


def request_body(
    engine: RemoteEngine, messages: Sequence[Message], params: GenerationParams
) -> dict[str, Any]:
    """The JSON of ``POST /v1/chat/completions`` (and LM Studio's ``/api/v0``) for ``engine``."""
    body: dict[str, Any] = {
        "messages": [m.as_dict() for m in messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
    }
    if engine.model:
        body["model"] = engine.model
    if 0 < params.top_p < 1:
        body["top_p"] = params.top_p
    if params.seed is not None:
        body["seed"] = params.seed
    if engine.kind in ("llama-server", "vllm", "mlx-lm") and params.top_k > 0:
        body["top_k"] = params.top_k
    if engine.kind in ("llama-server", "vllm", "mlx-lm") and params.min_p > 0:
        body["min_p"] = params.min_p
    if engine.draft_model and not params.drafting.off:
        if engine.kind == "mlx-lm":
            # mlx_lm.server takes a fixed k per request; an adaptive k sends its upper bound.
            body["draft_model"] = engine.draft_model
            body["num_draft_tokens"] = params.drafting.num_draft or params.drafting.limit
        elif engine.kind == "lmstudio":
            body["draft_model"] = engine.draft_model
    return body


def _close_on_cancel(
    response: httpx.Response, cancel: threading.Event, done: threading.Event
) -> None:
    """Ends a blocked read once ``cancel`` is set, so Stop does not wait for the server.

    Closing the response alone leaves a read in progress blocked; shutting the
    socket down wakes it.
    """
    while not done.wait(0.05):
        if cancel.is_set():
            stream = response.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            response.close()
            return


_NEWLINE = re.compile(r"\r\n?|\n")  # SSE's line ends, and no others


def sse_lines(pieces: Iterable[str]) -> Iterator[str]:
    """The lines of an event stream arriving in ``pieces``, split as SSE says.

    Only CR, LF and CRLF end a line: U+2028 and its like may stand raw inside
    an event's JSON, where ``str.splitlines`` (and httpx's ``iter_lines``) would
    break it in two.
    """
    held = ""
    for piece in pieces:
        held += piece
        start = 0
        for end in _NEWLINE.finditer(held):
            if end.group() == "\r" and end.end() == len(held):
                break  # its LF may come in the next piece
            yield held[start : end.start()]
            start = end.end()
        held = held[start:]
    if held:
        yield held.removesuffix("\r")


def _events(response: httpx.Response, cancel: threading.Event) -> Iterator[str]:
    """The ``data`` of each server-sent event; stops early once ``cancel`` is set."""
    data: list[str] = []
    for line in sse_lines(response.iter_text()):
        if cancel.is_set():
            return
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):  # a comment, such as mlx_lm.server's keepalive
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
        elif field not in ("event", "id", "retry"):
            raise ModelError(f"{response.request.url.host} sent a garbled stream: {line[:60]!r}")
    if data and not cancel.is_set():
        yield "\n".join(data)


def chat_paths(kind: ServerKind) -> tuple[str, ...]:
    """The chat endpoints to try for ``kind``, in order; each but the last may answer 404.

    LM Studio reports draft counts only on its native ``/api/v0`` endpoint, which
    older versions lack, so they fall back to the OpenAI-compatible one.
    """
    return (LMSTUDIO_CHAT, OPENAI_CHAT) if kind == "lmstudio" else (OPENAI_CHAT,)


@contextmanager
def _open_chat(
    client: httpx.Client, engine: RemoteEngine, body: Mapping[str, Any]
) -> Iterator[httpx.Response]:
    """The streamed response of the first chat endpoint of ``engine`` that exists."""
    *preferred, last = chat_paths(engine.kind)
    for path in preferred:
        with client.stream("POST", engine.url + path, json=body) as response:
            if response.status_code != 404:
                yield response
                return
    with client.stream("POST", engine.url + last, json=body) as response:
        yield response


def _metrics(client: httpx.Client, engine: RemoteEngine) -> dict[str, float] | None:
    """vLLM's spec-decode counters now, or ``None`` when ``/metrics`` does not answer."""
    try:
        response = client.get(engine.url + "/metrics", timeout=_METRICS_TIMEOUT)
    except httpx.HTTPError:
        return None
    return adapters.parse_prometheus(response.text) if response.is_success else None


def _finish_reason(value: Any) -> FinishReason:
    return "length" if value == "length" else "stop"


def stream_remote(
    engine: RemoteEngine,
    messages: Sequence[Message],
    params: GenerationParams,
    cancel: threading.Event,
    *,
    key: str | None = None,
    timeout: float = STREAM_TIMEOUT,
) -> Iterator[Chunk | Finished]:
    """Streams one reply from ``engine``: a chunk per text delta, then :class:`Finished`.

    Args:
        engine: The server.
        messages: The conversation.
        params: Sampling and draft settings; the server uses what its kind accepts.
        cancel: Set to stop; checked between events, and the response is closed.
        key: Bearer key; ``None`` reads the one stored for ``engine.url`` (if any).
        timeout: Seconds without a byte before giving up.

    Yields:
        :class:`Chunk` per text delta (one pseudo token each, origin target), then
        :class:`Finished` whose stats carry ``stats_scope``.

    Raises:
        ModelError: Unreachable, wrong address, refused key, timeout, or a reply that
            is not a well-formed event stream.
    """
    if key is None:
        key = _stored_key(engine.url)
    body = request_body(engine, messages, params)
    limits = httpx.Timeout(timeout, connect=min(timeout, 10.0))
    pieces = 0
    usage: Mapping[str, Any] = {}
    report: SpecReport | None = None
    timings: Mapping[str, Any] = {}
    reason: FinishReason | None = None
    done = False
    first: float | None = None
    end = start = time.perf_counter()
    try:
        with (
            contextlib.ExitStack() as stack,
            httpx.Client(timeout=limits, headers=_headers(key)) as client,
        ):
            before = _metrics(client, engine) if engine.kind == "vllm" else None
            start = time.perf_counter()
            with _open_chat(client, engine, body) as response:
                # Stop must not wait for the server's next event: a watcher closes
                # the response, which ends the blocking read at once.
                watched = threading.Event()
                threading.Thread(
                    target=_close_on_cancel,
                    args=(response, cancel, watched),
                    name="tandem-remote-stop",
                    daemon=True,
                ).start()
                stack.callback(watched.set)
                if not response.is_success:
                    raise _status_error(response, engine, response.read())
                ctype = response.headers.get("content-type", "").split(";")[0].strip()
                if ctype != "text/event-stream":
                    raise ModelError(
                        f"{engine.host} did not answer with an event stream "
                        f"(got {ctype or 'no content type'}): is it an OpenAI-compatible server?"
                    )
                for data in _events(response, cancel):
                    if data.strip() == "[DONE]":
                        done = True
                        break
                    try:
                        payload = json.loads(data)
                    except ValueError:
                        raise ModelError(
                            f"{engine.host} sent a garbled stream: {data[:60]!r}"
                        ) from None
                    if not isinstance(payload, dict):
                        raise ModelError(f"{engine.host} sent a garbled stream: {data[:60]!r}")
                    if "error" in payload:
                        error = payload["error"]
                        text = error.get("message", error) if isinstance(error, dict) else error
                        raise ModelError(f"{engine.host} failed: {_first_line(str(text))}")
                    if isinstance(payload.get("usage"), Mapping):
                        usage = payload["usage"]
                    if isinstance(payload.get("timings"), Mapping):
                        timings = payload["timings"]
                    elif isinstance(payload.get("stats"), Mapping):
                        timings = _lmstudio_timings(payload["stats"])
                    report = adapters.from_payload(engine.kind, payload) or report
                    for choice in payload.get("choices") or ():
                        if not isinstance(choice, Mapping):
                            continue
                        delta = choice.get("delta")
                        text = delta.get("content") if isinstance(delta, Mapping) else None
                        if isinstance(text, str) and text:
                            if first is None:
                                first = time.perf_counter()
                            pieces += 1
                            yield Chunk(text, (REMOTE_TOKEN,), (Origin.TARGET,), (text,))
                        if choice.get("finish_reason"):
                            reason = _finish_reason(choice["finish_reason"])
            end = time.perf_counter()
            if cancel.is_set():
                reason = "cancelled"
            elif not done and reason is None:
                raise ModelError(f"{engine.host} closed the stream before the reply ended")
            if report is None and before is not None and reason != "cancelled":
                after = _metrics(client, engine)
                report = adapters.vllm_counters(before, after) if after is not None else None
    except (httpx.HTTPError, httpx.StreamError) as exc:
        if not cancel.is_set():
            if isinstance(exc, httpx.HTTPError):
                raise _transport_error(exc, engine, timeout) from None
            raise ModelError(f"{engine.host}: the stream broke ({_first_line(str(exc))})") from None
        # The watcher closed the stream for Stop: a cancelled reply, not an error.
        end, reason = time.perf_counter(), "cancelled"
    stats = _stats(usage, timings, report or NOT_REPORTED, pieces, start, first, end)
    ids = (REMOTE_TOKEN,) * pieces
    yield Finished(stats, reason or "stop", ids, (Origin.TARGET,) * pieces)


def _lmstudio_timings(stats: Mapping[str, Any]) -> dict[str, float]:
    """LM Studio's own times (seconds) in llama-server's ``timings`` shape, when both are there."""
    ttft, generation = stats.get("time_to_first_token"), stats.get("generation_time")
    if isinstance(ttft, int | float) and isinstance(generation, int | float):
        return {"prompt_ms": ttft * 1000, "predicted_ms": generation * 1000}
    return {}


def _stats(
    usage: Mapping[str, Any],
    timings: Mapping[str, Any],
    report: SpecReport,
    pieces: int,
    start: float,
    first: float | None,
    end: float,
) -> Stats:
    """Token counts from ``usage`` (deltas when absent), times from the server or the clock."""
    tokens = adapters._count(usage.get("completion_tokens"))
    prompt = adapters._count(usage.get("prompt_tokens")) or 0
    ttft = (first - start) if first is not None else end - start
    generation = (end - first) if first is not None else 0.0
    prompt_seconds = ttft
    # llama-server measures its own times; they leave out the network.
    prompt_ms, predicted_ms = timings.get("prompt_ms"), timings.get("predicted_ms")
    if isinstance(prompt_ms, int | float) and isinstance(predicted_ms, int | float):
        prompt_seconds, generation = prompt_ms / 1000, predicted_ms / 1000
    return Stats(
        prompt_tokens=prompt,
        tokens=tokens if tokens is not None else pieces,
        drafted=report.drafted,
        accepted=report.accepted,
        draft_rounds=report.rounds,
        num_draft=0,
        prompt_seconds=prompt_seconds,
        generation_seconds=generation,
        ttft_seconds=ttft,
        stats_scope=report.scope,
    )
