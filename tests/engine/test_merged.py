"""Several sequences of a hybrid model in one forward, their caches merged and split back."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from app.engine.caches import new_cache, rewind
from app.engine.loader import config_model
from app.engine.merged import mergeable, merged_forward
from app.engine.recurrent import install, leaves
from tests.engine.families import hybrid_config

PROMPTS = ([3, 4, 5, 6, 7, 8, 9], [11, 12, 13], [20, 21, 22, 23, 24])


@pytest.fixture(scope="module", params=["qwen3_5", "falcon_h1"])
def model(request: pytest.FixtureRequest) -> Any:
    """A tiny hybrid model, its recurrent states noted (falcon_h1: a list of caches a layer)."""
    m = config_model(hybrid_config(request.param))
    mx.eval(m.parameters())
    install(m)
    return m


def _alone(model: Any, prompt: list[int], *rows: list[int]) -> tuple[list[Any], mx.array]:
    cache = new_cache(model)
    out = model(mx.array([prompt]), cache=cache)
    for r in rows:
        out = model(mx.array([r]), cache=cache)
    return cache, out


def test_a_merged_forward_gives_each_sequence_its_own_logits_and_caches(model) -> None:
    caches = [_alone(model, p)[0] for p in PROMPTS]
    assert mergeable(model, caches)
    rows = [[30, 31, 32, 33], [40], [50, 51]]  # ragged: each padded to 4, then given back
    got = merged_forward(model, [mx.array(r) for r in rows], caches)
    for prompt, r, cache, logits in zip(PROMPTS, rows, caches, got, strict=True):
        want_cache, want = _alone(model, prompt, r)
        assert logits.shape == want.shape
        assert mx.allclose(logits, want, rtol=1e-4, atol=1e-4)
        offsets = [c.offset for c in leaves(cache) if hasattr(c, "offset")]
        assert offsets == [c.offset for c in leaves(want_cache) if hasattr(c, "offset")]
        # Its caches go on alone as if they had always been its own.
        after = model(mx.array([[60]]), cache=cache)
        assert mx.allclose(after, model(mx.array([[60]]), cache=want_cache), atol=1e-4)


def test_each_sequence_goes_back_into_a_merged_forward_as_into_its_own(model) -> None:
    caches = [_alone(model, p)[0] for p in PROMPTS]
    merged_forward(model, [mx.array([30, 31, 32, 33])] * 3, caches)
    kept = (1, 3, 4)  # rows each keeps: a verification's accepted drafts differ
    for prompt, keep, cache in zip(PROMPTS, kept, caches, strict=True):
        assert rewind(cache, 4 - keep)
        want_cache, _ = _alone(model, prompt, [30, 31, 32, 33][:keep])
        after = model(mx.array([[60]]), cache=cache)
        assert mx.allclose(after, model(mx.array([[60]]), cache=want_cache), atol=1e-4)


def test_caches_of_very_different_lengths_run_apart(model) -> None:
    """Keys padded to the longest would take more memory than a batched reply budgets."""
    caches = [_alone(model, [5] * 60)[0], _alone(model, [6])[0], _alone(model, [7])[0]]
    assert not mergeable(model, caches)
    assert not mergeable(model, caches[:1])  # and one sequence runs as itself


def test_long_prompts_of_different_lengths_are_read_together_exactly(model) -> None:
    """Prompt chunks longer than a recurrent cache goes back cannot be padded and given back."""
    from mlx_lm.generate import generate_step

    from app.engine.decoder import Decoder, take_turns
    from app.engine.types import DraftSetting, GenerationParams

    prompts = [[30 + i % 150 for i in range(n)] for n in (700, 600)]  # then chunks of 187, 87
    params = GenerationParams(temperature=0, drafting=DraftSetting.of(0))
    decoder = Decoder(model)
    gens = [decoder.generate(p, params) for p in prompts]
    for gen in gens:
        next(gen)  # both have joined before either reads its prompt: they read together
    turns = take_turns(gens, 12)
    for prompt, reply in zip(prompts, turns.replies, strict=True):
        want = [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=12)]
        assert reply[:12] == want
