"""OpenAI chat completions: request parsing and response builders.

Requests are validated into :class:`ChatRequest`; responses follow OpenAI's
``chat.completion`` and ``chat.completion.chunk`` objects, with Tandem's
speculative decoding counts in ``usage.completion_tokens_details`` and a
llama-server-style ``timings`` object.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any, cast, get_args

from app.engine.observe import BatchStats
from app.engine.types import (
    PARAM_RANGES,
    DraftSetting,
    FinishReason,
    GenerationParams,
    InvalidParamError,
    InvalidTextError,
    Message,
    Role,
    Stats,
    check_text,
)

_ROLES = get_args(Role)
MAX_STOPS = 4  # OpenAI's limit on stop strings
# Line breaks JSON leaves raw but line-splitting SSE clients (str.splitlines) break at.
_SSE_ESCAPES = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}
# The request's names of GenerationParams fields that it does not call by their own name.
_FIELD_PARAMS = {"num_draft": "num_draft_tokens"}


class RequestError(Exception):
    """A request the server refuses; ``status`` is the HTTP status to answer with."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.kind = kind
        self.code = code


@dataclass(frozen=True, slots=True)
class ModelsInfo:
    """The models the server can answer with: the loaded target and its draft, by id."""

    target: str
    draft: str | None = None
    # Other names (such as the folder path) that mean the same draft.
    draft_aliases: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated ``POST /v1/chat/completions`` body."""

    messages: tuple[Message, ...]
    params: GenerationParams
    model: str
    stream: bool = False
    include_usage: bool = False
    stop: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReplyStarted:
    """The engine took the request; text follows."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New reply text; ``tokens`` it completes, and the prompt's length once known."""

    text: str
    tokens: int = 0
    prompt_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ReplyFinished:
    """The reply ended; ``stats`` are Tandem's counts of it."""

    finish_reason: FinishReason
    stats: Stats = field(default_factory=Stats)


@dataclass(frozen=True, slots=True)
class ReplyFailed:
    """The engine failed the reply; ``message`` is one line for the client.

    ``status`` is 400 when the request itself was at fault (a conversation
    longer than the window, with ``code`` ``"context_length_exceeded"``), 429
    when the memory is full, 503 when the server cut the reply as it stopped;
    a failure before any text is answered with it instead of a stream, one
    after it ends the stream with an error event and no ``finish_reason``.
    """

    message: str
    status: int = 500
    code: str | None = None


Event = ReplyStarted | TextDelta | ReplyFinished | ReplyFailed


@dataclass(frozen=True, slots=True)
class Metrics:
    """What ``GET /metrics`` reports: requests running and waiting, batch totals.

    Attributes:
        active: Replies running (the window's included).
        waiting: Replies waiting for a place.
        batched: Of the active, replies in the shared batch.
        max_batch: Most replies the batch runs at once.
        batch: The shared batch's totals since the pair loaded.
    """

    active: int = 0
    waiting: int = 0
    batched: int = 0
    max_batch: int = 1
    batch: BatchStats = field(default_factory=BatchStats)


def metrics_text(m: Metrics) -> str:
    """``m`` in Prometheus's text format, as vLLM and llama-server publish theirs."""
    b = m.batch
    rows: list[tuple[str, str, str, float]] = [
        ("tandem_requests_running", "gauge", "Replies running, the window's included.", m.active),
        ("tandem_requests_waiting", "gauge", "Replies waiting for a place.", m.waiting),
        ("tandem_batch_requests", "gauge", "Replies in the shared batch.", m.batched),
        ("tandem_batch_size_max", "gauge", "Most replies the batch runs at once.", m.max_batch),
        ("tandem_batch_rounds_total", "counter", "Batched rounds run.", b.rounds),
        ("tandem_draft_tokens_total", "counter", "Tokens the batch proposed.", b.drafted),
        ("tandem_accepted_tokens_total", "counter", "Proposed tokens kept.", b.accepted),
        ("tandem_generated_tokens_total", "counter", "Tokens the batch committed.", b.tokens),
        ("tandem_batch_largest", "gauge", "Most replies one round verified.", b.largest),
        (
            "tandem_prompt_tokens_shared_total",
            "counter",
            "Prompt tokens a request copied from another's caches rather than read.",
            b.shared,
        ),
    ]
    if b.acceptance is not None:
        rows.append(
            ("tandem_batch_acceptance", "gauge", "Accepted over drafted tokens.", b.acceptance)
        )
    lines = []
    for name, kind, doc, value in rows:
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name} {value:g}"]
    return "\n".join(lines) + "\n"


def _param(body: dict[str, Any], key: str, name: str | None = None) -> Any:
    """The body's ``key`` for the sampling field ``name`` (``key`` itself when omitted).

    Checked against the field's one range in :data:`PARAM_RANGES`; ``None`` when absent.
    """
    value = body.get(key)
    if value is None:
        return None
    bounds = PARAM_RANGES[name or key]
    if not bounds.holds(value):
        raise RequestError(f"'{key}' must be {bounds.rule}.", param=key)
    return value if bounds.whole else float(value)


def _text(value: str, param: str) -> str:
    try:
        check_text(value, param)
    except InvalidTextError as exc:
        raise RequestError(f"{exc}.", param=param) from None
    return value


def _content(value: Any, index: int) -> str:
    """A message's text: a string, or OpenAI's list of ``{"type": "text"}`` parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return _text(value, f"messages[{index}].content")
    if isinstance(value, list):
        parts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise RequestError(
                    f"messages[{index}].content: only text parts are supported.",
                    param=f"messages[{index}].content",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise RequestError(
                    f"messages[{index}].content: a text part needs 'text'.",
                    param=f"messages[{index}].content",
                )
            parts.append(text)
        return _text("".join(parts), f"messages[{index}].content")
    raise RequestError(
        f"messages[{index}].content must be a string or a list of text parts.",
        param=f"messages[{index}].content",
    )


def _messages(value: Any) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value:
        raise RequestError("'messages' must be a non-empty list.", param="messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object.", param=f"messages[{i}]")
        role = m.get("role")
        if role == "developer":  # OpenAI's newer name for the system role
            role = "system"
        if role not in _ROLES:
            raise RequestError(
                f"messages[{i}].role must be one of system, developer, user, assistant.",
                param=f"messages[{i}].role",
            )
        out.append(Message(cast(Role, role), _content(m.get("content"), i)))
    return tuple(out)


def _drafting(value: Any, default: DraftSetting) -> DraftSetting:
    if value is None:
        return default
    try:
        return DraftSetting.parse(value, default.limit)
    except InvalidParamError as exc:
        message = f"'num_draft_tokens' must be {exc.rule}."
        raise RequestError(message, param="num_draft_tokens") from None


def _stop(value: Any) -> tuple[str, ...]:
    """OpenAI's ``stop``: a string, or a list of up to :data:`MAX_STOPS` of them."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if (
        not isinstance(stops, list)
        or not 1 <= len(stops) <= MAX_STOPS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise RequestError(
            f"'stop' must be a non-empty string or a list of 1 to {MAX_STOPS} of them.",
            param="stop",
        )
    return tuple(_text(s, "stop") for s in stops)


def _check_draft(value: Any, models: ModelsInfo) -> None:
    """Refuses a ``draft_model`` other than the loaded draft, rather than ignoring it."""
    if value is None:
        return
    if not isinstance(value, str):
        raise RequestError("'draft_model' must be a string.", param="draft_model")
    if models.draft is None:
        raise RequestError(
            f"No draft model is loaded, so draft_model '{value}' cannot be used; "
            "omit draft_model, or load a pair with that draft in Tandem.",
            param="draft_model",
            code="model_not_found",
        )
    if value not in (models.draft, *models.draft_aliases):
        raise RequestError(
            f"draft_model '{value}' is not the loaded draft '{models.draft}'; Tandem serves "
            "one pair and does not switch drafts per request. Omit draft_model or name "
            f"'{models.draft}'.",
            param="draft_model",
            code="model_not_found",
        )


def parse_chat_request(
    body: Any, models: ModelsInfo, defaults: GenerationParams | None = None
) -> ChatRequest:
    """Validates a chat completions body.

    Args:
        body: The decoded JSON body.
        models: The loaded pair, to check ``draft_model`` against.
        defaults: Sampling and drafting used where the request says nothing.

    Returns:
        The request, with :class:`GenerationParams` for the engine.

    Raises:
        RequestError: The body is not a valid request (status 400).
    """
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object.")
    base = defaults or GenerationParams()
    messages = _messages(body.get("messages"))
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string.", param="model")
    # Any name is taken (one pair is served) and none is echoed: replies name the
    # loaded target, so a huge name cannot multiply into every chunk.
    if model is not None:
        _text(model, "model")
    stop = _stop(body.get("stop"))
    _check_draft(body.get("draft_model"), models)
    max_tokens = _param(body, "max_completion_tokens", "max_tokens")
    if max_tokens is None:
        max_tokens = _param(body, "max_tokens")
    n = body.get("n")  # one choice only; anything else is refused, not ignored
    if n is not None and (type(n) is not int or n != 1):
        raise RequestError("'n' must be 1: Tandem gives one choice per request.", param="n")
    temperature = _param(body, "temperature")
    top_p = _param(body, "top_p")
    top_k = _param(body, "top_k")
    min_p = _param(body, "min_p")
    repetition_penalty = _param(body, "repetition_penalty")
    seed = _param(body, "seed")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be true or false.", param="stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise RequestError("'stream_options' must be an object.", param="stream_options")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise RequestError(
                "'stream_options.include_usage' must be true or false.",
                param="stream_options",
            )
    try:
        params = replace(
            base,
            max_tokens=max_tokens if max_tokens is not None else base.max_tokens,
            temperature=base.temperature if temperature is None else temperature,
            top_p=base.top_p if top_p is None else top_p,
            top_k=base.top_k if top_k is None else top_k,
            min_p=base.min_p if min_p is None else min_p,
            repetition_penalty=(
                base.repetition_penalty if repetition_penalty is None else repetition_penalty
            ),
            seed=base.seed if seed is None else seed,
            drafting=_drafting(body.get("num_draft_tokens"), base.drafting),
        )
    except InvalidParamError as exc:  # the fields are checked above; this is a safety net
        param = _FIELD_PARAMS.get(exc.name, exc.name)
        raise RequestError(f"'{param}' must be {exc.rule}.", param=param) from None
    if models.draft is None and not params.drafting.off and not params.prompt_lookup:
        params = replace(params, drafting=DraftSetting.fixed(0))  # nothing to draft with: plain
    return ChatRequest(messages, params, models.target, stream, include_usage, stop)


def completion_id() -> str:
    """A fresh ``chatcmpl-…`` id."""
    return f"chatcmpl-{secrets.token_hex(12)}"


def _finish_reason(reason: FinishReason) -> str:
    return "length" if reason == "length" else "stop"


def usage(stats: Stats) -> dict[str, Any]:
    """OpenAI's ``usage``, with accepted and rejected draft tokens."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.tokens,
        "total_tokens": stats.prompt_tokens + stats.tokens,
        "prompt_tokens_details": {"cached_tokens": stats.reused_tokens},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "accepted_prediction_tokens": stats.accepted,
            "rejected_prediction_tokens": max(0, stats.drafted - stats.accepted),
        },
    }


def timings(stats: Stats) -> dict[str, Any]:
    """llama-server's ``timings`` object."""
    prompt_ms = stats.prompt_seconds * 1000
    predicted_ms = stats.decode_seconds * 1000  # the time behind predicted_per_second
    return {
        "prompt_n": stats.prompt_tokens,
        "prompt_ms": prompt_ms,
        "prompt_per_second": stats.prompt_tps,
        "predicted_n": stats.tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_second": stats.generation_tps,
        "draft_n": stats.drafted,
        "draft_n_accepted": stats.accepted,
    }


def completion(
    cid: str, created: int, model: str, text: str, finished: ReplyFinished
) -> dict[str, Any]:
    """A whole ``chat.completion`` object."""
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": _finish_reason(finished.finish_reason),
            }
        ],
        "usage": usage(finished.stats),
        "timings": timings(finished.stats),
    }


@dataclass(slots=True)
class ChunkStream:
    """Builds the ``chat.completion.chunk`` objects of one streamed reply.

    All chunks share one ``id``, ``created`` and ``model``. When usage is
    included every chunk carries ``usage: null`` except the last, as OpenAI does.
    """

    model: str
    include_usage: bool = False
    id: str = field(default_factory=completion_id)
    created: int = field(default_factory=lambda: int(time.time()))

    def _chunk(self, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def role(self) -> dict[str, Any]:
        """The first chunk: the assistant role and empty content."""
        return self._chunk({"role": "assistant", "content": ""}, None)

    def content(self, text: str) -> dict[str, Any]:
        return self._chunk({"content": text}, None)

    def finish(self, finished: ReplyFinished) -> dict[str, Any]:
        """The chunk with ``finish_reason`` and an empty delta, plus ``timings``."""
        chunk = self._chunk({}, _finish_reason(finished.finish_reason))
        chunk["timings"] = timings(finished.stats)
        return chunk

    def usage(self, finished: ReplyFinished) -> dict[str, Any]:
        """The last chunk when usage is included: no choices, only ``usage``."""
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [],
            "usage": usage(finished.stats),
        }


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event line: ``data: …`` and a blank line.

    U+0085, U+2028 and U+2029 go as JSON escapes, so the event stays one line
    for clients that split at every Unicode line break.
    """
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text.translate(_SSE_ESCAPES)}\n\n".encode()


DONE = sse("[DONE]")


def error_body(error: RequestError) -> dict[str, Any]:
    """OpenAI's error object."""
    return {
        "error": {
            "message": error.message,
            "type": error.kind,
            "param": error.param,
            "code": error.code,
        }
    }


def models_list(models: ModelsInfo | None, created: int = 0) -> dict[str, Any]:
    """``GET /v1/models``: the target, then the draft."""
    ids = [] if models is None else [models.target, *([models.draft] if models.draft else [])]
    return {
        "object": "list",
        "data": [
            {"id": i, "object": "model", "created": created, "owned_by": "tandem"} for i in ids
        ],
    }
