"""Sliding-window models: speculation stays exact once a conversation passes the window."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from app.engine import Finished, GenerationParams, Message, load_pair
from app.engine.caches import ChunkKVCache, WindowKVCache, new_cache, rewind
from app.engine.decoder import Decoder
from app.engine.generate import encode_chat, new_decoder, stream_reply
from app.engine.loader import ModelPair
from app.engine.sparse import SparseCache
from app.engine.types import DraftSetting
from tests.conftest import TinyModels
from tests.engine.families import FAMILIES, WINDOW, plain_greedy, window_pair


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request: pytest.FixtureRequest, tiny: TinyModels, tmp_path_factory) -> ModelPair:
    """A tiny ``family`` target with a byte copy of itself as the draft: every draft is right."""
    root = tmp_path_factory.mktemp(request.param)
    return load_pair(*window_pair(root, request.param, tiny.target))


def _reply(pair: ModelPair, messages: list[Message], decoder: Any, **params: Any) -> Finished:
    *_, last = stream_reply(
        pair, messages, GenerationParams(temperature=0, max_tokens=48, **params), decoder=decoder
    )
    assert isinstance(last, Finished)
    return last


SHORT = [Message("user", "Hi")]
LONG = [Message("user", "Summarise the following text in one sentence. " * 3)]


@pytest.mark.parametrize("num_draft", [1, 4, 16, None])
@pytest.mark.parametrize("messages", [SHORT, LONG], ids=["short", "long"])
def test_the_windows_reply_is_plain_greedy_past_the_window(pair, messages, num_draft) -> None:
    prompt = encode_chat(pair.target.tokenizer, messages)
    end = _reply(pair, messages, new_decoder(pair), drafting=DraftSetting.of(num_draft))
    assert len(prompt) + len(end.token_ids) > 2 * WINDOW  # the reply crosses the window
    assert list(end.token_ids) == plain_greedy(pair, prompt, 48)
    assert end.stats.accepted == end.stats.drafted > 0  # a copy's drafts are all right


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
def test_a_follow_up_and_an_edit_reuse_the_caches_and_stay_exact(pair, batch: bool) -> None:
    draft = pair.draft.model if pair.draft is not None else None
    decoder = Decoder(pair.target.model, draft) if batch else new_decoder(pair)
    first = _reply(pair, LONG, decoder, drafting=DraftSetting.of(4))
    text = pair.target.tokenizer.decode(list(first.token_ids))
    follow = [*LONG, Message("assistant", text), Message("user", "And the sea?")]
    edited = [Message("user", "Write a haiku about the sea. " * 3)]
    for messages in (follow, edited):
        end = _reply(pair, messages, decoder, drafting=DraftSetting.of(None))
        prompt = encode_chat(pair.target.tokenizer, messages)
        assert list(end.token_ids) == plain_greedy(pair, prompt, 48)


def test_a_bounded_layer_goes_back_exactly_only_as_far_as_it_holds(pair) -> None:
    model = pair.target.model
    cache = new_cache(model)
    bounded = [c for c in cache if isinstance(c, WindowKVCache | ChunkKVCache | SparseCache)]
    assert bounded  # the family's sliding or chunked layers are made exact to rewind
    first = bounded[0]
    if isinstance(first, WindowKVCache | SparseCache):  # its slack past the window
        model(mx.arange(3 * WINDOW + first.slack)[None], cache=cache)
        reach = first.slack
    else:  # back to its chunk's start, once a forward let the older rows go
        model(mx.arange(3 * WINDOW + 5)[None], cache=cache)
        model(mx.array([[7]]), cache=cache)
        reach = first.offset % first.chunk_size
    before = [c.offset for c in cache]
    assert not rewind(cache, reach + 1)  # refused whole: nothing changed
    assert [c.offset for c in cache] == before
    assert rewind(cache, reach)
    assert [c.offset for c in cache] == [o - reach for o in before]
