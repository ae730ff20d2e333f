"""DeepSeek-V4's compressed sparse attention: its cache goes back exactly.

tests/engine/test_windows.py runs the window's reply, a follow-up and an edit over a
tiny DeepSeek-V4 with its copy as the draft; these add a draft that is sometimes wrong,
lookup, a batch, and the cache's rows themselves.
"""

from __future__ import annotations

import json
from typing import Any

import mlx.core as mx
import pytest

from app.engine import Finished, GenerationParams, Message, load_pair
from app.engine.caches import back_to, mark, new_cache, prefill, reachable, rewind
from app.engine.generate import encode_chat, new_decoder, stream_reply
from app.engine.loader import ModelPair
from app.engine.rounds import prepare
from app.engine.sparse import SparseCache
from app.testing.tiny import build_model
from tests.conftest import TinyModels
from tests.engine.families import WINDOW, batch_replies, plain_greedy, window_pair

TOKENS = 40
LONG = [Message("user", "Summarise the following text in one sentence. " * 3)]


@pytest.fixture(scope="module")
def noisy(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> ModelPair:
    """A tiny DeepSeek-V4 target with a draft of its weights plus noise: some drafts wrong."""
    root = tmp_path_factory.mktemp("deepseek_v41")
    target, _ = window_pair(root, "deepseek_v41", tiny.target)
    config = json.loads((target / "config.json").read_text())
    draft = build_model(
        root / "noisy", config, tokenizer_from=tiny.target, weights_from=target, noise=0.05
    )
    return load_pair(target, draft)


def _reply(pair: ModelPair, **params: Any) -> Finished:
    *_, last = stream_reply(
        pair,
        LONG,
        GenerationParams(temperature=0, max_tokens=TOKENS, **params),
        decoder=new_decoder(pair),
    )
    assert isinstance(last, Finished)
    return last


@pytest.mark.parametrize(
    "params",
    [{"num_draft": 4}, {"num_draft": None}, {"num_draft": 4, "prompt_lookup": True}],
    ids=["k4", "auto", "lookup"],
)
def test_a_draft_that_is_sometimes_wrong_leaves_the_reply_plain_greedy(noisy, params) -> None:
    from app.engine.types import DraftSetting

    num_draft = params.pop("num_draft")
    end = _reply(noisy, drafting=DraftSetting.of(num_draft), **params)
    prompt = encode_chat(noisy.target.tokenizer, LONG)
    assert len(prompt) + len(end.token_ids) > 2 * WINDOW  # past the window
    assert list(end.token_ids) == plain_greedy(noisy, prompt, TOKENS)
    assert 0 < end.stats.accepted < end.stats.drafted  # some drafts were given back


def test_requests_of_a_batch_are_plain_greedy(noisy) -> None:
    chats = [LONG, [Message("user", "Hi")], [Message("user", "Name three colours.")]]
    for prompt, reply in batch_replies(noisy, chats, TOKENS):
        want = plain_greedy(noisy, prompt, TOKENS)
        assert reply[: len(want)] == want


def _layers(cache: list[object]) -> list[SparseCache]:
    assert all(isinstance(c, SparseCache) for c in cache)
    return [c for c in cache if isinstance(c, SparseCache)]


@pytest.mark.parametrize("prompt", [3, 13, 42], ids=["in-a-group", "in-the-window", "past-it"])
def test_a_cache_gone_back_holds_what_one_that_read_only_the_kept_rows_holds(
    noisy, prompt: int
) -> None:
    model = noisy.target.model
    prepare(model, None)
    tokens = list(range(5, 5 + prompt))
    cache, fresh = new_cache(model), new_cache(model)
    prefill(model, cache, tokens)
    prefill(model, fresh, tokens)
    model(mx.array([[50, 51, 52, 53, 54, 55, 56]]), cache=cache)  # a round of 7 rows
    assert rewind(cache, 5)  # two kept
    model(mx.array([[50, 51]]), cache=fresh)
    for got, want in zip(_layers(cache), _layers(fresh), strict=True):
        assert got.offset == want.offset == prompt + 2
        for name in ("window", "compress_kv", "index_k", "pending_kv", "pending_gate"):
            a, b = getattr(got, name), getattr(want, name)
            assert (a is None) == (b is None) or (a is not None and a.shape[1] == 0), name
            if a is not None and b is not None:
                assert a.shape == b.shape, name
                assert mx.allclose(a, b, atol=1e-5), name
    # And it reads on as that one does.
    after = model(mx.array([[9, 8, 7, 6, 5]]), cache=cache)
    assert mx.allclose(after, model(mx.array([[9, 8, 7, 6, 5]]), cache=fresh), atol=1e-4)


def test_it_goes_back_only_as_far_as_it_holds(noisy) -> None:
    model = noisy.target.model
    prepare(model, None)
    cache = new_cache(model)
    first = _layers(cache)[0]
    prefill(model, cache, list(range(1, 3 * WINDOW + first.slack)))
    before = [c.offset for c in _layers(cache)]
    assert not rewind(cache, first.slack + 1)  # the window's oldest row is gone: nothing changed
    assert [c.offset for c in _layers(cache)] == before
    assert rewind(cache, first.slack)


def test_without_its_compressors_noted_a_compressing_layer_does_not_go_back(noisy) -> None:
    from app.engine.loader import config_model

    config = json.loads((noisy.target.path / "config.json").read_text())
    model = config_model(config)  # built, never prepared: its compressors are mlx-lm's own
    cache = new_cache(model)
    model(mx.array([[1, 2, 3, 4, 5, 6]]), cache=cache)
    assert not rewind(cache, 3)
    assert [c.offset for c in _layers(cache)] == [6] * len(cache)


@pytest.mark.parametrize("prompt", [3, 42], ids=["in-a-group", "past-the-window"])
def test_a_marked_point_is_gone_back_to_past_the_rows_held(noisy, prompt: int) -> None:
    model = noisy.target.model
    prepare(model, None)
    tokens = list(range(5, 5 + prompt))
    cache = new_cache(model)
    prefill(model, cache, tokens)
    mark(cache)  # a prompt's end: where a retry comes back to
    first = _layers(cache)[0]
    prefill(model, cache, list(range(100, 100 + 2 * (WINDOW + first.slack))))
    assert reachable(cache, prompt + 1) == prompt  # past the rows held: the mark
    back_to(cache, prompt)
    fresh = new_cache(model)
    prefill(model, fresh, tokens)
    got = model(mx.array([[9, 8, 7, 6, 5]]), cache=cache)
    assert mx.allclose(got, model(mx.array([[9, 8, 7, 6, 5]]), cache=fresh), atol=1e-4)
    assert reachable(cache, prompt + 3) == prompt + 3  # and rows held go back as ever


def test_the_engine_imports_deepseek_v4s_module_only_for_its_models() -> None:
    import subprocess
    import sys

    # Another mlx-lm may lack it: the app must start and serve other models all the same.
    code = (
        "import sys, app.engine.generate, app.engine.caches, app.engine.rounds; "
        "print('mlx_lm.models.deepseek_v41' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_mark_past_the_rows_given_back_is_let_go(noisy) -> None:
    model = noisy.target.model
    prepare(model, None)
    cache = new_cache(model)
    prefill(model, cache, list(range(5, 15)))
    mark(cache)  # at 10
    prefill(model, cache, [50, 51, 52, 53, 54])
    assert rewind(cache, 8)  # to 7, before the mark: its rows may be read anew
    first = _layers(cache)[0]
    prefill(model, cache, list(range(100, 100 + 2 * (WINDOW + first.slack))))
    assert reachable(cache, 10) == 0  # the mark held other rows: read from scratch
