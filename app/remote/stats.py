"""What each kind of server says about speculative decoding, as pure functions over JSON.

Every adapter returns a :class:`SpecReport` whose ``scope`` says how far the numbers
reach: ``"request"`` (this reply alone), ``"server"`` (the whole server over the
reply's time, other clients included) or ``"not reported"`` (the server says
nothing, so Tandem shows nothing rather than a made-up value).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

StatsScope = Literal["request", "server", "not reported"]
ServerKind = Literal["llama-server", "vllm", "lmstudio", "mlx-lm", "ollama", "openai-compatible"]
SERVER_KINDS: tuple[ServerKind, ...] = (
    "llama-server",
    "vllm",
    "lmstudio",
    "mlx-lm",
    "ollama",
    "openai-compatible",
)

# vLLM's Prometheus counters of speculative decoding (docs: "Production Metrics").
VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_COUNTERS = (VLLM_DRAFTS, VLLM_DRAFT_TOKENS, VLLM_ACCEPTED)

# name{labels} value [timestamp]; labels may hold spaces inside quotes.
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


@dataclass(frozen=True, slots=True)
class SpecReport:
    """Draft statistics of one reply as a server reported them.

    Attributes:
        scope: How far the numbers reach; ``"not reported"`` means they are zeros
            because the server said nothing.
        drafted: Draft tokens proposed.
        accepted: Draft tokens the target accepted.
        rounds: Drafting rounds (verify steps), when the server says.
    """

    scope: StatsScope
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0


NOT_REPORTED = SpecReport("not reported")


def _count(value: Any) -> int | None:
    """A non-negative whole count, or ``None`` for anything else (bools included)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value < 0 or value != int(value):
        return None
    return int(value)


def llama_server(payload: Mapping[str, Any]) -> SpecReport | None:
    """llama.cpp's llama-server: ``timings.draft_n`` and ``timings.draft_n_accepted``.

    The server adds ``timings`` to the last chunk of a stream; the draft fields are
    there only when the request drafted, so timings without them mean nothing was
    drafted for this request.

    Returns:
        The report, or ``None`` when ``payload`` carries no timings.
    """
    timings = payload.get("timings")
    if not isinstance(timings, Mapping):
        return None
    drafted = _count(timings.get("draft_n"))
    accepted = _count(timings.get("draft_n_accepted"))
    if drafted is None:
        return SpecReport("request")
    return SpecReport("request", drafted, min(accepted or 0, drafted))


def vllm_request(payload: Mapping[str, Any]) -> SpecReport | None:
    """vLLM's per-request ``metrics.speculative_decoding`` (``--per-request-spec-decode-metrics``).

    vLLM's own end-to-end test of ``--per-request-spec-decode-metrics`` reads
    ``num_draft_tokens``, ``num_accepted_draft_tokens`` and ``num_spec_steps``
    (plus ``mean_acceptance_length``, ``draft_acceptance_rate`` and, when
    detailed, ``acceptance_histogram`` and ``per_step_*``). The block is marked
    experimental, so the older ``num_accepted_tokens`` / ``num_drafts`` spellings
    are read too.

    Returns:
        The report, or ``None`` when the payload has no such block.
    """
    metrics = payload.get("metrics")
    if not isinstance(metrics, Mapping):
        return None
    spec = metrics.get("speculative_decoding")
    if not isinstance(spec, Mapping):
        return None
    drafted = _count(spec.get("num_draft_tokens"))
    accepted = _count(spec.get("num_accepted_draft_tokens", spec.get("num_accepted_tokens")))
    if drafted is None or accepted is None:
        return None
    rounds = _count(spec.get("num_spec_steps", spec.get("num_drafts"))) or 0
    return SpecReport("request", drafted, min(accepted, drafted), rounds)


def parse_prometheus(text: str, names: tuple[str, ...] = VLLM_COUNTERS) -> dict[str, float]:
    """Sums the samples of each named metric in Prometheus text format over all labels."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line.strip())
        if match is None or match.group(1) not in names:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        totals[match.group(1)] = totals.get(match.group(1), 0.0) + value
    return totals


def vllm_counters(before: Mapping[str, float], after: Mapping[str, float]) -> SpecReport:
    """The difference of vLLM's spec-decode counters around one reply, server-wide.

    Any other request served meanwhile is counted too, hence scope ``"server"``.
    A missing counter, or one that went backwards (a restart), reports nothing.
    """
    if not all(name in before and name in after for name in (VLLM_DRAFT_TOKENS, VLLM_ACCEPTED)):
        return NOT_REPORTED
    drafted = after[VLLM_DRAFT_TOKENS] - before[VLLM_DRAFT_TOKENS]
    accepted = after[VLLM_ACCEPTED] - before[VLLM_ACCEPTED]
    rounds = after.get(VLLM_DRAFTS, 0.0) - before.get(VLLM_DRAFTS, 0.0)
    if drafted < 0 or accepted < 0 or rounds < 0:
        return NOT_REPORTED
    return SpecReport("server", int(drafted), int(min(accepted, drafted)), int(rounds))


def lmstudio(payload: Mapping[str, Any]) -> SpecReport | None:
    """LM Studio's native ``/api/v0`` ``stats`` with a draft model loaded.

    Reads ``total_draft_tokens_count`` and ``accepted_draft_tokens_count``; when the
    total is missing it is accepted plus rejected (plus ignored) drafts.

    Returns:
        The report, or ``None`` when ``stats`` has no draft counts (no draft model,
        or the OpenAI-compatible endpoint, which has no ``stats``).
    """
    stats = payload.get("stats")
    if not isinstance(stats, Mapping):
        return None
    accepted = _count(stats.get("accepted_draft_tokens_count"))
    if accepted is None:
        return None
    total = _count(stats.get("total_draft_tokens_count"))
    if total is None:
        parts = (
            _count(stats.get("rejected_draft_tokens_count")),
            _count(stats.get("ignored_draft_tokens_count")) or 0,
        )
        if parts[0] is None:
            return None
        total = accepted + parts[0] + parts[1]
    return SpecReport("request", total, min(accepted, total))


def from_payload(kind: ServerKind, payload: Mapping[str, Any]) -> SpecReport | None:
    """The per-request report in one streamed JSON payload, for a server of ``kind``.

    mlx_lm.server takes ``draft_model`` and ``num_draft_tokens`` but reports no
    acceptance, and Ollama does not draft: both always give ``None``. A generic
    OpenAI-compatible server gets every documented per-request shape tried.
    """
    if kind == "llama-server":
        return llama_server(payload)
    if kind == "vllm":
        return vllm_request(payload)
    if kind == "lmstudio":
        return lmstudio(payload)
    if kind == "openai-compatible":
        # Unlike llama-server itself, an unknown server's timings without draft
        # counts do not mean "nothing drafted".
        timings = payload.get("timings")
        llama = (
            llama_server(payload) if isinstance(timings, Mapping) and "draft_n" in timings else None
        )
        return vllm_request(payload) or lmstudio(payload) or llama
    return None
