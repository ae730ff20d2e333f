"""Hybrid models (Gated DeltaNet, Mamba, short convolutions among attention): speculation exact.

Each family is a tiny random model of mlx-lm's own class; its draft a byte copy
(every draft right) or a model of the family with weights of its own.
"""

from __future__ import annotations

import gc
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest

from app.engine import Finished, GenerationParams, Message, load_pair
from app.engine import merged as merged_module
from app.engine.caches import (
    WindowKVCache,
    back_to,
    mark,
    new_cache,
    reachable,
    refusal,
    rewind,
)
from app.engine.decoder import Decoder, take_turns
from app.engine.generate import encode_chat, new_decoder, stream_reply
from app.engine.loader import ModelPair, config_model
from app.engine.merged import merged_forward
from app.engine.recurrent import DEPTH, RecurrentCache, install, leaves
from app.engine.types import DraftSetting
from tests.conftest import TinyModels
from tests.engine.families import (
    HYBRIDS,
    batch_replies,
    hybrid_config,
    hybrid_pair,
    plain_greedy,
)

TOKENS = 24


@pytest.fixture(scope="module", params=HYBRIDS)
def pairs(
    request: pytest.FixtureRequest, tiny: TinyModels, tmp_path_factory
) -> tuple[ModelPair, ModelPair]:
    """A tiny hybrid target with its copy as the draft, and with a draft of its own."""
    root = tmp_path_factory.mktemp(request.param)
    target, copy, other = hybrid_pair(root, request.param, tiny.target)
    same = load_pair(target, copy)
    assert same.draft is not None
    return same, load_pair(target, other)


_PLAIN: dict[tuple[str, tuple[int, ...]], list[int]] = {}


def _plain(pair: ModelPair, prompt: list[int]) -> list[int]:
    """mlx-lm's own greedy decoding over its own caches: the reference (once per prompt)."""
    key = (str(pair.target.path), tuple(prompt))
    if key not in _PLAIN:
        _PLAIN[key] = plain_greedy(pair, prompt, TOKENS)
    return _PLAIN[key]


def _reply(pair: ModelPair, messages: list[Message], decoder: Any, **params: Any) -> Finished:
    *_, last = stream_reply(
        pair,
        messages,
        GenerationParams(temperature=0, max_tokens=TOKENS, **params),
        decoder=decoder,
    )
    assert isinstance(last, Finished)
    return last


SHORT = [Message("user", "Hi")]
LONG = [Message("user", "Summarise the following text in one sentence. " * 14)]


@pytest.mark.parametrize(
    ("num_draft", "messages"),
    [(1, SHORT), (4, LONG), (16, SHORT), (None, LONG)],
    ids=["k1-short", "k4-long", "k16-short", "auto-long"],
)
def test_the_windows_reply_is_plain_greedy(pairs, num_draft, messages) -> None:
    same, other = pairs
    prompt = encode_chat(same.target.tokenizer, messages)
    want = _plain(same, prompt)
    end = _reply(same, messages, new_decoder(same), drafting=DraftSetting.of(num_draft))
    assert list(end.token_ids) == want
    assert end.stats.accepted == end.stats.drafted > 0  # a copy's drafts are all right
    if messages is LONG:  # and a draft of its own, some of its drafts rejected
        end = _reply(other, messages, new_decoder(other), drafting=DraftSetting.of(num_draft))
        assert list(end.token_ids) == want


def test_lookup_drafting_is_plain_greedy(pairs) -> None:
    same, _ = pairs
    messages = [Message("user", "Repeat: the cat sat on the mat, the cat sat on the mat.")]
    prompt = encode_chat(same.target.tokenizer, messages)
    end = _reply(same, messages, new_decoder(same), drafting=DraftSetting.of(4), prompt_lookup=True)
    assert list(end.token_ids) == _plain(same, prompt)


def test_requests_of_a_batch_with_different_acceptance_are_plain_greedy(pairs, monkeypatch) -> None:
    _, other = pairs
    assert other.draft is not None
    merged: list[int] = []

    def counted(model, tokens, caches):  # type: ignore[no-untyped-def]
        merged.append(len(tokens))
        return merged_forward(model, tokens, caches)

    monkeypatch.setattr(merged_module, "merged_forward", counted)
    chats = [SHORT, LONG, [Message("user", "Name three colours.")]]
    for prompt, reply in batch_replies(other, chats, TOKENS):
        want = _plain(other, prompt)
        assert reply[: len(want)] == want
    # The requests' steps and verifications ran as one forward, where their caches merge
    # (a sliding window's do not: Baichuan-M1's requests run side by side).
    cache = new_cache(other.target.model)
    assert merged or any(isinstance(c, WindowKVCache) for c in leaves(cache))


def test_a_follow_up_a_retry_and_an_edit_reuse_the_caches_and_stay_exact(pairs) -> None:
    same, _ = pairs
    decoder = new_decoder(same)
    first = _reply(same, LONG, decoder, drafting=DraftSetting.of(4))
    text = same.target.tokenizer.decode(list(first.token_ids))
    follow = [*LONG, Message("assistant", text), Message("user", "And the sea?")]
    edited = [*LONG, Message("assistant", text), Message("user", "And the sky at night?")]
    for messages in (follow, follow, edited):  # a turn, its retry, then an edit of it
        end = _reply(same, messages, decoder, drafting=DraftSetting.of(None))
        prompt = encode_chat(same.target.tokenizer, messages)
        assert list(end.token_ids) == _plain(same, prompt)
        # The long first prompt is not read again: a marked state or the newest rows.
        assert end.stats.reused_tokens > len(encode_chat(same.target.tokenizer, LONG)) // 2


def test_sampling_with_a_copy_accepts_its_drafts(pairs) -> None:
    same, _ = pairs
    *_, last = stream_reply(
        same,
        SHORT,
        GenerationParams(temperature=0.8, max_tokens=TOKENS, seed=3, drafting=DraftSetting.of(4)),
        decoder=new_decoder(same),
    )
    assert isinstance(last, Finished) and last.stats.drafted
    # The target's distribution is the draft's: only rounding keeps a draft out.
    assert last.stats.accepted >= 0.9 * last.stats.drafted


def test_a_forward_goes_back_to_the_state_of_the_rows_it_keeps(pairs) -> None:
    model = pairs[0].target.model
    install(model)
    prompt, rows = mx.arange(3, 13)[None], mx.arange(20, 25)[None]
    cache = new_cache(model)
    model(prompt, cache=cache)
    model(rows, cache=cache)
    assert rewind(cache, 3)
    got = model(mx.array([[7]]), cache=cache)
    fresh = new_cache(model)
    model(prompt, cache=fresh)
    model(rows[:, :2], cache=fresh)
    # Equal up to rounding: the attention layers' rows of 5 against 2 may take other kernels.
    assert mx.allclose(got, model(mx.array([[7]]), cache=fresh), rtol=1e-5, atol=1e-5)
    assert [c.offset for c in leaves(cache)] == [c.offset for c in leaves(fresh)]


def test_a_recurrent_state_goes_back_within_its_depth_or_to_a_mark(pairs) -> None:
    model = pairs[0].target.model
    install(model)
    cache = new_cache(model)
    assert any(isinstance(c, RecurrentCache) for c in leaves(cache))
    model(mx.arange(1, 2 * DEPTH)[None], cache=cache)  # deeper than any forward kept
    mark(cache)
    at = 2 * DEPTH - 1
    for t in range(5):
        model(mx.array([[t + 30]]), cache=cache)
    assert not rewind(cache, 6)  # into the long forward: refused whole
    assert reachable(cache, at - 1) == 0
    assert reachable(cache, at) == at  # the mark
    assert reachable(cache, at + 2) == at + 2  # within the newest forwards
    back_to(cache, at)
    got = model(mx.array([[9]]), cache=cache)
    fresh = new_cache(model)
    model(mx.arange(1, 2 * DEPTH)[None], cache=fresh)
    assert mx.array_equal(got, model(mx.array([[9]]), cache=fresh))


def test_every_hybrid_family_here_is_rewound(pairs) -> None:
    assert refusal(pairs[0].target.model) is None


def test_a_cache_that_cannot_give_rows_back_is_refused_by_its_kind() -> None:
    from mlx_lm.models.cache import _BaseCache

    class PagedCache(_BaseCache):  # a kind of cache mlx-lm adds after this release
        def is_trimmable(self) -> bool:
            return False

    class Model(nn.Module):
        def make_cache(self) -> list[Any]:
            return [PagedCache()]

    assert refusal(Model()) == "its layers' caches (PagedCache) cannot go back"


def test_a_recurrent_family_not_known_to_go_back_is_refused_by_its_name() -> None:
    from mlx_lm.models.cache import ArraysCache

    class Model(nn.Module):  # a family mlx-lm adds after this release
        def make_cache(self) -> list[Any]:
            return [ArraysCache(2)]

    Model.__module__ = "mlx_lm.models.newfamily"
    assert refusal(Model()) == (
        "its recurrent layers (newfamily) keep a state that cannot be given back"
    )


def test_tune_sweeps_a_hybrid_pair(pairs) -> None:
    from app.engine.calibrate import CalibrationResult, calibrate

    same, _ = pairs
    *_, result = calibrate(same, ["Hi", "Name three colours."], [0, 4, None], max_tokens=12)
    assert isinstance(result, CalibrationResult)
    _plain, fixed, _auto = result.points
    assert fixed.acceptance == 1.0  # a copy's drafts
    assert len({p.tokens for p in result.points}) == 1  # greedy: every k the same reply


@pytest.fixture(scope="module")
def qwen3_5() -> Any:
    """A tiny Qwen3.5 model, its recurrent states noted."""
    model = config_model(hybrid_config("qwen3_5"))
    mx.eval(model.parameters())
    install(model)
    return model


def test_only_a_rounds_rows_keep_their_states(qwen3_5) -> None:
    """Each row's state is kept for a verification's rows, not a prompt's: a 100-row
    forward of a 27B-shaped model would hold 15 GB of them."""
    from app.engine.costs import K_MAX
    from app.engine.recurrent import ROWS_KEPT

    assert ROWS_KEPT == K_MAX + 1  # a round's rows: its drafts and the token before
    model = qwen3_5

    def held(rows: int) -> tuple[int, int]:
        cache = new_cache(model)
        gc.collect()
        before = mx.get_active_memory()
        out = model(mx.arange(1, rows + 1)[None], cache=cache)
        mx.eval(out, [c.state for c in leaves(cache)])
        del out
        gc.collect()
        state = sum(c.nbytes for c in leaves(cache) if isinstance(c, RecurrentCache))
        return mx.get_active_memory() - before, state

    (short, state), (long, _) = held(ROWS_KEPT), held(100)
    assert short > ROWS_KEPT // 2 * state  # a verification's states are kept
    assert long - short < 50 * state  # 100 rows' would be 83 more


def test_a_cache_holds_the_states_of_its_newest_forwards_only(qwen3_5) -> None:
    """Each forward it can go back into holds the state before it: a 27B-shaped target's
    128 newest plain steps would hold 18 GB of them."""
    from app.engine.recurrent import FORWARDS, TARGET_FORWARDS

    model = qwen3_5

    def held(forwards: int) -> tuple[int, int]:
        gc.collect()
        before = mx.get_active_memory()
        cache = new_cache(model, forwards)
        model(mx.arange(1, 30)[None], cache=cache)
        for _ in range(DEPTH):  # plain steps, one row each
            mx.eval(model(mx.array([[5]]), cache=cache))
        gc.collect()
        state = sum(c.nbytes for c in leaves(cache) if isinstance(c, RecurrentCache))
        return mx.get_active_memory() - before, state

    (draft, state), (target, _) = held(FORWARDS), held(TARGET_FORWARDS)
    # A forward holds the state before it and its convolution's input (on this tiny
    # model as large as a state): about two states each.
    assert target < draft < target + 3 * FORWARDS * state
    assert draft < 80 * state  # DEPTH forwards would hold about 256


def test_a_forward_over_mlx_lms_own_cache_notes_nothing_into_ours(qwen3_5) -> None:
    """bench runs mlx-lm's plain loop on the same model between Tandem's replies."""
    from mlx_lm.models.cache import make_prompt_cache

    model = qwen3_5
    prompt, rows = mx.arange(3, 13)[None], mx.arange(20, 25)[None]
    cache = new_cache(model)
    model(prompt, cache=cache)
    mark(cache)  # as a reply's prompt is: its forward closed
    theirs = make_prompt_cache(model)
    model(mx.arange(1, 10)[None], cache=theirs)
    model(mx.array([[5]]), cache=theirs)
    model(rows, cache=cache)
    assert rewind(cache, 3)
    fresh = new_cache(model)
    model(prompt, cache=fresh)
    model(rows[:, :2], cache=fresh)
    assert [c.offset for c in leaves(cache)] == [c.offset for c in leaves(fresh)]
    got = model(mx.array([[7]]), cache=cache)
    assert mx.allclose(got, model(mx.array([[7]]), cache=fresh), rtol=1e-5, atol=1e-5)


def test_kimi_k3s_one_token_steps_go_back_where_metal_would_compile_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On Metal its Kimi Delta Attention runs a one-token step compiled, its recurrence
    # traced once and unseen after; a draft's steps are such, and must still go back.
    model = config_model(hybrid_config("kimi_k3"))
    model.eval()  # as loaded: its one-token step is taken in eval mode only
    install(model)
    monkeypatch.setattr(mx.metal, "is_available", lambda: True)
    prompt = mx.arange(3, 13)[None]
    cache = new_cache(model)
    model(prompt, cache=cache)
    for token in (20, 21, 22):
        model(mx.array([[token]]), cache=cache)
    assert rewind(cache, 2)
    got = model(mx.array([[7]]), cache=cache)
    fresh = new_cache(model)
    model(prompt, cache=fresh)
    model(mx.array([[20]]), cache=fresh)
    assert mx.allclose(got, model(mx.array([[7]]), cache=fresh), rtol=1e-5, atol=1e-5)


def test_requests_whose_states_differ_in_shape_step_side_by_side(
    tiny: TinyModels, tmp_path
) -> None:
    # LongCat's state is its last tokens: fewer while a prompt is a token long.
    target, copy, _ = hybrid_pair(tmp_path, "longcat_flash_ngram", tiny.target)
    pair = load_pair(target, copy)
    assert pair.draft is not None
    decoder = Decoder(pair.target.model, pair.draft.model)
    prompts = [[5], [3, 9, 27, 81, 243, 100, 7, 50]]
    params = GenerationParams(temperature=0, drafting=DraftSetting.of(4))
    turns = take_turns([decoder.generate(p, params) for p in prompts], 12)
    for prompt, reply in zip(prompts, turns.replies, strict=True):
        assert reply == plain_greedy(pair, prompt, 12)[: len(reply)]
