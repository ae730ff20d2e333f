"""Stats adapters over payloads written from each server's documented format."""

from __future__ import annotations

from app.remote import stats
from app.remote.stats import NOT_REPORTED, SpecReport


def test_llama_server_timings_with_drafts() -> None:
    # llama.cpp tools/server/README.md, "POST /v1/chat/completions": final chunk's `timings`.
    payload = {
        "choices": [],
        "timings": {"predicted_n": 40, "draft_n": 30, "draft_n_accepted": 21},
    }
    assert stats.from_payload("llama-server", payload) == SpecReport("request", 30, 21)


def test_llama_server_timings_without_drafts_mean_none_drafted() -> None:
    # Same README: draft_n / draft_n_accepted appear only when speculative decoding ran.
    payload = {"timings": {"predicted_n": 40, "predicted_ms": 800.0}}
    assert stats.from_payload("llama-server", payload) == SpecReport("request", 0, 0)
    assert stats.from_payload("llama-server", {"choices": []}) is None


def test_vllm_per_request_metrics() -> None:
    # vLLM docs, features/speculative_decoding/acceptance_metrics ("Per-Request Acceptance
    # Metrics", --per-request-spec-decode-metrics summary): metrics.speculative_decoding.
    payload = {
        "usage": {"completion_tokens": 50},
        "metrics": {
            "speculative_decoding": {
                "num_drafts": 12,
                "num_draft_tokens": 36,
                "num_accepted_tokens": 27,
            }
        },
    }
    assert stats.from_payload("vllm", payload) == SpecReport("request", 36, 27, 12)
    assert stats.from_payload("vllm", {"usage": {}, "metrics": {"ttft": 0.1}}) is None


def test_vllm_prometheus_counters_difference_is_server_wide() -> None:
    # vLLM docs, "Production Metrics" (/metrics, Prometheus text exposition format).
    before = stats.parse_prometheus(
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.\n"
        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
    )
    after = stats.parse_prometheus(
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 14.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 42.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 29.0\n'
    )
    assert before[stats.VLLM_DRAFT_TOKENS] == 30.0
    assert "vllm:num_requests_running" not in before
    assert stats.vllm_counters(before, after) == SpecReport("server", 12, 9, 4)


def test_vllm_counters_missing_or_reset_report_nothing() -> None:
    counters = {stats.VLLM_DRAFT_TOKENS: 50.0, stats.VLLM_ACCEPTED: 40.0}
    restarted = {stats.VLLM_DRAFT_TOKENS: 3.0, stats.VLLM_ACCEPTED: 1.0}
    assert stats.vllm_counters({}, counters) is NOT_REPORTED
    assert stats.vllm_counters(counters, restarted) is NOT_REPORTED


def test_lmstudio_api_v0_stats() -> None:
    # LM Studio docs, "REST API v0" (/api/v0/chat/completions), `stats` with a draft model.
    payload = {
        "stats": {
            "tokens_per_second": 51.4,
            "draft_model": "qwen2.5-0.5b-instruct",
            "total_draft_tokens_count": 40,
            "accepted_draft_tokens_count": 31,
            "rejected_draft_tokens_count": 7,
            "ignored_draft_tokens_count": 2,
        }
    }
    assert stats.from_payload("lmstudio", payload) == SpecReport("request", 40, 31)
    del payload["stats"]["total_draft_tokens_count"]
    assert stats.from_payload("lmstudio", payload) == SpecReport("request", 40, 31)


def test_lmstudio_openai_endpoint_reports_nothing() -> None:
    # LM Studio docs, "OpenAI Compatibility Endpoints": usage only, no `stats`.
    payload = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9}}
    assert stats.from_payload("lmstudio", payload) is None


def test_mlx_lm_and_ollama_never_report_drafts() -> None:
    # mlx-lm SERVER.md: draft_model / num_draft_tokens are request fields, the usage chunk
    # has prompt/completion tokens only. Ollama docs/openai.md: no speculative decoding.
    usage = {"choices": [], "usage": {"prompt_tokens": 13, "completion_tokens": 8}}
    assert stats.from_payload("mlx-lm", usage) is None
    assert stats.from_payload("ollama", usage) is None
    # Even a payload shaped like another server's is not believed for these kinds.
    assert stats.from_payload("ollama", {"timings": {"draft_n": 3}}) is None


def test_generic_server_needs_draft_counts() -> None:
    assert stats.from_payload("openai-compatible", {"timings": {"predicted_n": 3}}) is None
    reported = {"timings": {"draft_n": 4, "draft_n_accepted": 9}}
    # Accepted is capped at drafted: a server's inconsistency is not passed on.
    assert stats.from_payload("openai-compatible", reported) == SpecReport("request", 4, 4)


def test_malformed_counts_are_ignored() -> None:
    assert stats.from_payload("llama-server", {"timings": {"draft_n": "8"}}) == SpecReport(
        "request"
    )
    bad = {"metrics": {"speculative_decoding": {"num_draft_tokens": -1, "num_accepted_tokens": 0}}}
    assert stats.from_payload("vllm", bad) is None


def test_vllm_per_request_block_as_vllms_own_e2e_test_reads_it() -> None:
    """vLLM repository, tests/e2e test_per_request_spec_decode_metrics (``detailed``).

    Its check: num_spec_steps == sum(histogram), num_accepted_draft_tokens ==
    sum(per_step_accepted), num_draft_tokens == sum(per_step_drafted), and the
    block rides the last (usage) chunk of a stream at the response root.
    """
    from app.remote.stats import vllm_request

    chunk = {
        "id": "cmpl-1",
        "choices": [],
        "usage": {"prompt_tokens": 12, "completion_tokens": 24, "total_tokens": 36},
        "metrics": {
            "speculative_decoding": {
                "num_spec_steps": 8,
                "num_draft_tokens": 24,
                "num_accepted_draft_tokens": 16,
                "mean_acceptance_length": 3.0,
                "draft_acceptance_rate": 16 / 24,
                "acceptance_histogram": [1, 1, 2, 4],
                "per_step_accepted": [3, 3, 3, 3, 2, 2, 1, 0],
                "per_step_drafted": [3, 3, 3, 3, 3, 3, 3, 3],
            }
        },
    }
    report = vllm_request(chunk)
    assert report is not None
    assert (report.scope, report.drafted, report.accepted, report.rounds) == ("request", 24, 16, 8)
