"""Chat request parsing and the OpenAI response builders."""

from __future__ import annotations

import json

import pytest

from app.engine.types import DraftSetting, GenerationParams, Stats
from app.server.protocol import (
    DONE,
    ChunkStream,
    ModelsInfo,
    ReplyFinished,
    RequestError,
    completion,
    error_body,
    models_list,
    parse_chat_request,
    sse,
    timings,
    usage,
)

PAIR = ModelsInfo("target", "draft", ("/models/draft",))
MESSAGES = [{"role": "user", "content": "hi"}]
STATS = Stats(
    prompt_tokens=10,
    reused_tokens=4,
    tokens=20,
    drafted=15,
    accepted=12,
    prompt_seconds=0.5,
    generation_seconds=2.0,
)


def test_parses_sampling_and_drafting_fields() -> None:
    req = parse_chat_request(
        {
            "model": "target",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "max_completion_tokens": 33,
            "max_tokens": 99,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 40,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "seed": 7,
            "stream": True,
            "stream_options": {"include_usage": True},
            "draft_model": "draft",
            "num_draft_tokens": "auto",
        },
        PAIR,
    )
    assert [(m.role, m.content) for m in req.messages] == [("system", "be brief"), ("user", "ab")]
    p = req.params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (
        33,
        0.7,
        0.9,
        40,
        0.05,
        7,
    )
    assert p.repetition_penalty == pytest.approx(1.1)
    assert p.drafting.num_draft is None  # auto
    assert req.stream and req.include_usage


def test_defaults_fill_what_the_request_leaves_out() -> None:
    defaults = GenerationParams(max_tokens=64, temperature=0.3, drafting=DraftSetting.of(5))
    req = parse_chat_request({"messages": MESSAGES}, PAIR, defaults)
    assert (req.params.max_tokens, req.params.temperature, req.params.drafting.num_draft) == (
        64,
        0.3,
        5,
    )
    assert req.model == "target"
    assert not req.stream and not req.include_usage


def test_num_draft_tokens_zero_turns_speculation_off() -> None:
    req = parse_chat_request({"messages": MESSAGES, "num_draft_tokens": 0}, PAIR)
    assert req.params.drafting.num_draft == 0


def test_without_a_draft_decoding_is_plain() -> None:
    req = parse_chat_request({"messages": MESSAGES, "num_draft_tokens": 3}, ModelsInfo("t"))
    assert req.params.drafting.num_draft == 0


@pytest.mark.parametrize("name", ["draft", "/models/draft"])
def test_the_loaded_draft_may_be_named(name: str) -> None:
    req = parse_chat_request({"messages": MESSAGES, "draft_model": name}, PAIR)
    assert req.params.drafting.num_draft == GenerationParams().drafting.num_draft


def test_another_draft_is_refused_not_ignored() -> None:
    with pytest.raises(RequestError, match="not the loaded draft 'draft'") as err:
        parse_chat_request({"messages": MESSAGES, "draft_model": "other"}, PAIR)
    assert (err.value.status, err.value.param) == (400, "draft_model")
    with pytest.raises(RequestError, match="No draft model is loaded"):
        parse_chat_request({"messages": MESSAGES, "draft_model": "other"}, ModelsInfo("t"))


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
        ),
        ({"messages": MESSAGES, "temperature": "hot"}, "temperature"),
        ({"messages": MESSAGES, "temperature": 5}, "temperature"),
        ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
        ({"messages": MESSAGES, "max_tokens": 2.5}, "max_tokens"),
        ({"messages": MESSAGES, "top_k": True}, "top_k"),
        ({"messages": MESSAGES, "num_draft_tokens": -1}, "num_draft_tokens"),
        ({"messages": MESSAGES, "num_draft_tokens": "many"}, "num_draft_tokens"),
        ({"messages": MESSAGES, "stream": "yes"}, "stream"),
        ({"messages": MESSAGES, "stream_options": {"include_usage": 1}}, "stream_options"),
        ({"messages": MESSAGES, "n": 2}, "n"),
    ],
)
def test_bad_requests_say_which_field(body: dict[str, object], param: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_chat_request(body, PAIR)
    assert err.value.param == param
    assert err.value.status == 400


def test_a_body_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(RequestError, match="JSON object"):
        parse_chat_request([1, 2], PAIR)


def test_usage_counts_accepted_and_rejected_draft_tokens() -> None:
    u = usage(STATS)
    assert (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) == (10, 20, 30)
    assert u["prompt_tokens_details"] == {"cached_tokens": 4}
    assert u["completion_tokens_details"]["accepted_prediction_tokens"] == 12
    assert u["completion_tokens_details"]["rejected_prediction_tokens"] == 3


def test_timings_follow_llama_server() -> None:
    t = timings(STATS)
    assert t["prompt_n"] == 10 and t["prompt_ms"] == pytest.approx(500)
    assert t["predicted_n"] == 20 and t["predicted_ms"] == pytest.approx(2000)
    assert t["predicted_per_second"] == pytest.approx(10)
    assert (t["draft_n"], t["draft_n_accepted"]) == (15, 12)


def test_completion_object() -> None:
    body = completion("chatcmpl-1", 123, "target", "hello", ReplyFinished("cancelled", STATS))
    assert (body["id"], body["object"], body["created"], body["model"]) == (
        "chatcmpl-1",
        "chat.completion",
        123,
        "target",
    )
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "hello", "refusal": None}
    assert choice["finish_reason"] == "stop"  # a stopped reply ends as "stop"
    assert body["usage"]["completion_tokens"] == 20
    assert body["timings"]["draft_n_accepted"] == 12


def test_chunks_share_one_id_and_end_with_usage() -> None:
    stream = ChunkStream("target", include_usage=True)
    finished = ReplyFinished("length", STATS)
    chunks = [stream.role(), stream.content("he"), stream.finish(finished), stream.usage(finished)]
    assert len({(c["id"], c["created"], c["model"]) for c in chunks}) == 1
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[1]["choices"][0]["delta"] == {"content": "he"}
    assert chunks[2]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "length",
    }
    assert all(c["usage"] is None for c in chunks[:3])
    assert chunks[3]["choices"] == []
    assert chunks[3]["usage"]["completion_tokens_details"]["rejected_prediction_tokens"] == 3


def test_chunks_without_usage_carry_no_usage_key() -> None:
    stream = ChunkStream("target")
    assert "usage" not in stream.content("x")


def test_sse_lines() -> None:
    assert DONE == b"data: [DONE]\n\n"
    assert json.loads(sse({"a": "é"})[len(b"data: ") :].decode()) == {"a": "é"}


def test_sse_escapes_unicode_line_breaks_that_json_leaves_raw() -> None:
    text = "a\u0085b\u2028c\u2029d\u00e9"
    line = sse({"content": text})
    assert line.count(b"\n") == 2 and line.endswith(b"\n\n")
    assert len(line.decode().rstrip("\n").splitlines()) == 1  # one line even to splitlines
    assert json.loads(line[len(b"data: ") :].decode()) == {"content": text}


def test_stop_is_a_string_or_a_list_of_up_to_four() -> None:
    assert parse_chat_request({"messages": MESSAGES}, PAIR).stop == ()
    assert parse_chat_request({"messages": MESSAGES, "stop": "x"}, PAIR).stop == ("x",)
    four = ["a", "b", "\n\n", "d"]
    assert parse_chat_request({"messages": MESSAGES, "stop": four}, PAIR).stop == tuple(four)


def test_the_requests_model_is_not_what_replies_name() -> None:
    req = parse_chat_request({"messages": MESSAGES, "model": "m" * 10_000}, PAIR)
    assert req.model == "target"


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "repetition_penalty"])
def test_an_integer_too_big_for_a_float_is_out_of_range(field: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_chat_request({"messages": MESSAGES, field: 10**400}, PAIR)
    assert (err.value.status, err.value.param) == (400, field)


def test_error_and_models_bodies() -> None:
    err = error_body(RequestError("bad", param="x", code="c"))
    assert err == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "x", "code": "c"}
    }
    listing = models_list(PAIR)
    assert [m["id"] for m in listing["data"]] == ["target", "draft"]
    assert models_list(None)["data"] == []


def test_metrics_say_how_many_prompt_tokens_were_shared_rather_than_read() -> None:
    from app.engine.observe import BatchStats
    from app.server.protocol import Metrics, metrics_text

    text = metrics_text(Metrics(active=2, batched=2, batch=BatchStats(rounds=3, shared=140)))
    assert "# TYPE tandem_prompt_tokens_shared_total counter" in text
    assert "\ntandem_prompt_tokens_shared_total 140\n" in text
