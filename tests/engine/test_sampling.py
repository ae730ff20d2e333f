"""Each request samples on its own: a seed fixes a reply, and only its own."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from app.engine import GenerationParams, load_pair
from app.engine.decoder import Decoder, take_turns
from app.engine.loader import ModelPair
from app.engine.rounds import Round
from app.engine.types import DraftSetting
from tests.conftest import TinyModels

PROMPT = list(range(40, 70))
N = 40
SAMPLED: dict[str, Any] = dict(temperature=0.9, top_p=0.95, repetition_penalty=1.1)


@pytest.fixture(scope="module")
def pair(tiny: TinyModels) -> ModelPair:
    return load_pair(tiny.target, tiny.noisy)  # a draft that misses now and then


def _alone(pair: ModelPair, decoder: Decoder | None = None, **params: Any) -> list[int]:
    draft = pair.draft.model if pair.draft is not None else None
    decoder = decoder or Decoder(pair.target.model, draft)
    return take_turns([decoder.generate(PROMPT, GenerationParams(**params))], N).replies[0]


def _among(pair: ModelPair, others: list[dict[str, Any]], **params: Any) -> list[int]:
    """The reply of a request batched with ``others``, who leave (disconnect) early."""
    assert pair.draft is not None
    batch = Decoder(pair.target.model, pair.draft.model)
    gens = [batch.generate(PROMPT, GenerationParams(**params))]
    gens += [batch.generate(PROMPT[: 10 + i], GenerationParams(**o)) for i, o in enumerate(others)]
    replies: list[list[int]] = [[] for _ in gens]
    live = list(range(len(gens)))
    while 0 in live:
        for i in list(live):
            event = next(gens[i])
            if isinstance(event, Round):
                replies[i] += event.tokens
            if len(replies[i]) >= (N if i == 0 else 8 * i):
                gens[i].close()
                live.remove(i)
    for i in live:
        gens[i].close()
    return replies[0][:N]


def test_a_seeded_reply_is_plain_decodings_at_any_k_alone_or_among_others(pair) -> None:
    plain = _alone(pair, drafting=DraftSetting.of(0), seed=7, **SAMPLED)
    for num_draft in (1, 4, 16, None):
        assert _alone(pair, drafting=DraftSetting.of(num_draft), seed=7, **SAMPLED) == plain, (
            num_draft
        )
    assert pair.draft is not None
    warm = Decoder(pair.target.model, pair.draft.model)  # caches, baseline and costs known
    assert [
        _alone(pair, warm, drafting=DraftSetting.of(None), seed=7, **SAMPLED) for _ in range(2)
    ] == [plain] * 2
    others: list[dict[str, Any]] = [
        dict(drafting=DraftSetting.of(2), **SAMPLED),
        dict(drafting=DraftSetting.of(None), seed=3, temperature=1.0),
    ]
    assert _among(pair, others, drafting=DraftSetting.of(4), seed=7, **SAMPLED) == plain
    assert _among(pair, others[:1], drafting=DraftSetting.of(None), seed=7, **SAMPLED) == plain


def test_an_unseeded_reply_never_draws_from_the_global_generator(pair) -> None:
    mx.random.seed(11)
    want = mx.random.uniform(shape=(4,)).tolist()
    mx.random.seed(11)  # as another client's seed once did
    replies = [_alone(pair, drafting=DraftSetting.of(3), **SAMPLED) for _ in range(2)]
    assert mx.random.uniform(shape=(4,)).tolist() == want  # nothing drawn from it
    assert replies[0] != replies[1]  # and nothing fixed by it
