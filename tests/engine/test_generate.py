from __future__ import annotations

import threading

import pytest

from app.engine import Chunk, Finished, GenerationParams, Message, Origin, load_pair
from app.engine.decoder import PROBE
from app.engine.generate import encode_chat, new_decoder, stream_reply
from app.engine.types import DraftSetting, Reading
from tests.conftest import TinyModels

PROMPTS = [
    [Message("user", "Write a haiku about the sea.")],
    [Message("system", "You are a helpful assistant."), Message("user", "def add(a, b):")],
]


def _run(pair, messages, **params) -> tuple[list[Chunk], Finished]:
    events = list(stream_reply(pair, messages, GenerationParams(**params)))
    readings = [e for e in events if isinstance(e, Reading)]
    assert events[: len(readings)] == readings  # the prompt is read before any token
    *chunks, finished = events[len(readings) :]
    assert isinstance(finished, Finished)
    assert all(isinstance(c, Chunk) for c in chunks)
    return [c for c in chunks if isinstance(c, Chunk)], finished


@pytest.fixture(scope="module")
def plain(tiny: TinyModels):
    return load_pair(tiny.target)


@pytest.mark.parametrize("draft_name", ["copy", "noisy", "draft"])
@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_greedy_with_draft_equals_plain_greedy(tiny: TinyModels, plain, draft_name, k) -> None:
    pair = load_pair(tiny.target, getattr(tiny, draft_name))
    for messages in PROMPTS:
        _, want = _run(plain, messages, max_tokens=40, drafting=DraftSetting.of(0))
        _, got = _run(pair, messages, max_tokens=40, drafting=DraftSetting.of(k))
        assert got.token_ids == want.token_ids
        assert got.finish_reason == want.finish_reason
        assert got.stats.drafted > 0


def test_noisy_draft_is_partly_accepted(tiny: TinyModels) -> None:
    pair = load_pair(tiny.target, tiny.noisy)
    _, f = _run(pair, PROMPTS[0], max_tokens=40, drafting=DraftSetting.of(4))
    assert 0 < f.stats.accepted < f.stats.drafted
    assert Origin.CORRECTION in f.origins


def test_copy_draft_accepts_everything(tiny_pair) -> None:
    _, f = _run(tiny_pair, PROMPTS[0], max_tokens=30, drafting=DraftSetting.of(4))
    s = f.stats
    assert s.drafted > 0
    assert s.accepted == s.drafted
    assert s.acceptance == 1.0
    # Plain probe rounds measure the baseline; every other token was drafted.
    assert set(f.origins) <= {Origin.TARGET, Origin.DRAFT, Origin.BONUS}
    # The first token is a plain step; probes add their plain tokens until the
    # baseline settles (a warm-up and three samples), then a probe every 64 rounds.
    assert f.origins.count(Origin.TARGET) <= 1 + PROBE * (4 + len(f.origins) // 64)


def test_copy_draft_accepts_everything_when_sampling(tiny_pair) -> None:
    _, f = _run(
        tiny_pair, PROMPTS[0], max_tokens=30, drafting=DraftSetting.of(3), temperature=1.0, seed=7
    )
    assert f.stats.drafted > 0
    assert f.stats.acceptance == 1.0


def test_sampling_is_reproducible_with_a_seed(tiny: TinyModels) -> None:
    pair = load_pair(tiny.target, tiny.noisy)
    runs = [
        _run(
            pair, PROMPTS[0], max_tokens=20, drafting=DraftSetting.of(3), temperature=0.8, seed=11
        )[1]
        for _ in range(2)
    ]
    assert runs[0].token_ids == runs[1].token_ids


def test_text_is_the_decoded_tokens(tiny_pair) -> None:
    chunks, f = _run(tiny_pair, PROMPTS[1], max_tokens=25, drafting=DraftSetting.of(4))
    text = "".join(c.text for c in chunks)
    assert text == tiny_pair.target.tokenizer.decode(list(f.token_ids))
    assert [t for c in chunks for t in c.token_ids] == list(f.token_ids)
    assert len(f.origins) == len(f.token_ids)


def test_max_tokens_is_respected(tiny_pair) -> None:
    _, f = _run(tiny_pair, PROMPTS[0], max_tokens=5, drafting=DraftSetting.of(4))
    assert len(f.token_ids) <= 5
    if f.finish_reason == "length":
        assert len(f.token_ids) == 5
    assert f.stats.tokens == len(f.token_ids)


def test_stats_are_consistent(tiny_pair) -> None:
    _, f = _run(tiny_pair, PROMPTS[0], max_tokens=30, drafting=DraftSetting.of(4))
    s = f.stats
    assert s.prompt_tokens == len(encode_chat(tiny_pair.target.tokenizer, PROMPTS[0]))
    assert s.num_draft == 4
    assert s.target_calls >= 1
    assert s.ttft_seconds > 0
    assert s.generation_tps > 0
    assert s.as_dict()["acceptance"] == s.acceptance


def test_stop_ends_within_one_round(tiny_pair) -> None:
    cancel = threading.Event()
    events = stream_reply(
        tiny_pair, PROMPTS[0], GenerationParams(max_tokens=200, drafting=DraftSetting.of(2)), cancel
    )
    first = next(e for e in events if not isinstance(e, Reading))
    assert isinstance(first, Chunk)
    cancel.set()
    rest = list(events)
    assert [type(e) for e in rest][-1] is Finished
    tokens_after_stop = sum(len(e.token_ids) for e in rest if isinstance(e, Chunk))
    assert tokens_after_stop == 0
    finished = rest[-1]
    assert isinstance(finished, Finished)
    assert finished.finish_reason == "cancelled"
    assert finished.token_ids == first.token_ids


def test_stop_inside_a_round_ends_the_reply_as_cancelled(tiny_pair, monkeypatch) -> None:
    cancel = threading.Event()
    events = stream_reply(
        tiny_pair, PROMPTS[0], GenerationParams(max_tokens=200, drafting=DraftSetting.of(4)), cancel
    )
    replies = (e for e in events if isinstance(e, Chunk))
    chunks = [next(replies)]
    while chunks[-1].round is None or not chunks[-1].round.k:  # past the plain first steps
        chunks.append(next(replies))
    model_class = type(tiny_pair.target.model)  # the draft's too: a copy of the target
    real = model_class.__call__

    def call(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        assert self is tiny_pair.draft.model, "the target ran after the stop"
        cancel.set()  # during the next round's first draft step
        return real(self, *args, **kwargs)

    monkeypatch.setattr(model_class, "__call__", call)
    *rest, finished = list(events)
    assert isinstance(finished, Finished) and finished.finish_reason == "cancelled"
    assert not any(isinstance(e, Chunk) and e.token_ids for e in rest)
    assert finished.token_ids == tuple(t for c in chunks for t in c.token_ids)


def test_without_draft_every_token_is_the_targets(tiny: TinyModels, plain) -> None:
    _, f = _run(plain, PROMPTS[0], max_tokens=10, drafting=DraftSetting.of(4))
    assert set(f.origins) == {Origin.TARGET}
    assert f.stats.drafted == 0
    assert f.stats.acceptance is None


def test_each_chunk_carries_its_tokens_text_and_round(tiny_pair) -> None:
    chunks, f = _run(tiny_pair, PROMPTS[1], max_tokens=30, drafting=DraftSetting.of(3))
    token_chunks = [c for c in chunks if c.token_ids]
    for c in token_chunks:
        assert len(c.pieces) == len(c.token_ids) and "".join(c.pieces) == c.text
        assert c.round is not None and c.round.tokens == len(c.token_ids)
        # The last round may end inside its drafts: it counts only those in the reply.
        assert (c.round.k in (0, 3) or c is token_chunks[-1]) and c.round.k <= 3
        assert 0 <= c.round.accepted <= c.round.k
    # The rounds add up to the message's stats.
    rounds = [c.round for c in token_chunks if c.round is not None]
    assert sum(r.k for r in rounds) == f.stats.drafted
    assert sum(r.accepted for r in rounds) == f.stats.accepted
    assert sum(r.tokens for r in rounds) == f.stats.tokens


def test_a_control_changes_k_mid_stream(tiny_pair) -> None:
    from app.engine.rounds import DraftControl

    control = DraftControl(DraftSetting.fixed(2))
    ks: list[int] = []
    room: list[int] = []  # what each round may propose: the budget left but its last token
    made = 0
    for event in stream_reply(
        tiny_pair, PROMPTS[0], GenerationParams(max_tokens=40, seed=0), control=control
    ):
        if isinstance(event, Chunk) and event.round is not None:
            ks.append(event.round.k)
            room.append(40 - made - 1)
            made += event.round.tokens
            if len(ks) == 3:
                control.set(DraftSetting.fixed(5))
        if isinstance(event, Finished):
            end = event
    assert set(ks[:3]) <= {0, 2} and 5 in ks[3:]
    # From the round after the change on, 5 or what the budget leaves (or a plain probe).
    assert all(k in (0, min(5, r)) for k, r in zip(ks[4:], room[4:], strict=True))
    assert end.stats.num_draft == 5  # the setting the reply ended on, not the one it began on


def test_a_conversation_longer_than_the_window_is_refused_with_numbers(
    tiny: TinyModels, tmp_path
) -> None:
    import json
    import shutil

    from app.errors import ModelError

    folder = shutil.copytree(tiny.target, tmp_path / "short")
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = 24
    (folder / "config.json").write_text(json.dumps(config))
    pair = load_pair(folder)
    assert pair.target.context_length == 24
    with pytest.raises(ModelError, match=r"tokens, more than short's window of 24\. Start a new"):
        list(stream_reply(pair, [Message("user", "word " * 40)]))
    _run(pair, [Message("user", "Hi")], max_tokens=2)  # a short one still works


def test_chunks_say_the_prompt_length_and_the_speed_is_over_the_rounds_time(tiny_pair) -> None:
    chunks, f = _run(tiny_pair, PROMPTS[0], max_tokens=20, drafting=DraftSetting.of(4))
    s = f.stats
    timed = [c.round for c in chunks if c.round is not None]
    assert timed and all(c.prompt_tokens == s.prompt_tokens for c in chunks if c.round)
    # Decoding is the rounds' time (a round cut at the end of text reaches no chunk),
    # never the prompt or the time around the rounds.
    assert s.decode_seconds == pytest.approx(s.draft_seconds + s.verify_seconds)
    assert sum(r.seconds for r in timed) <= s.decode_seconds + 1e-9
    assert s.decode_seconds <= s.generation_seconds
    assert s.generation_tps == pytest.approx(s.tokens / s.decode_seconds)


def test_reading_the_prompt_streams_before_the_first_chunk(tiny: TinyModels, monkeypatch) -> None:
    from app.engine import decoder as decoder_module

    monkeypatch.setattr(decoder_module, "PREFILL_CHUNK", 8)
    pair = load_pair(tiny.target)
    decoder = new_decoder(pair)
    events = list(stream_reply(pair, PROMPTS[1], GenerationParams(max_tokens=4), decoder=decoder))
    n = len(encode_chat(pair.target.tokenizer, PROMPTS[1]))
    readings = [e for e in events if isinstance(e, Reading)]
    assert readings == [Reading(d, n, 0) for d in range(0, n - 1, 8)]
    assert events[: len(readings)] == readings
    # The next turn reads only what the cache lacks, and says what it reused.
    reply = "".join(e.text for e in events if isinstance(e, Chunk))
    turn = [*PROMPTS[1], Message("assistant", reply), Message("user", "More.")]
    events = list(stream_reply(pair, turn, GenerationParams(max_tokens=4), decoder=decoder))
    first = events[0]
    finished = events[-1]
    assert isinstance(first, Reading) and isinstance(finished, Finished)
    assert first.reused == first.done == finished.stats.reused_tokens > 0
    assert first.total == finished.stats.prompt_tokens


def test_drafts_past_the_end_of_the_reply_are_not_counted(tiny_pair) -> None:
    # A copy draft at k = 8; after the first token and two probes (9 plain tokens),
    # the decoder drafts no more than the budget leaves: 2 drafts and the target's own.
    plain = 1 + 2 * PROBE
    chunks, f = _run(tiny_pair, PROMPTS[0], max_tokens=plain + 3, drafting=DraftSetting.of(8))
    s = f.stats
    assert s.tokens == plain + 3 and s.drafted > 0
    # Before, the cut round's 8 drafts counted: "Tokens 6, acceptance 100 % (8 of 8)".
    assert s.accepted <= s.tokens and s.drafted <= s.tokens
    assert s.acceptance == 1.0
    assert sum(c.round.accepted for c in chunks if c.round is not None) == s.accepted
    assert sum(c.round.k for c in chunks if c.round is not None) == s.drafted
