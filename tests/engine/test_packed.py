"""Several sequences in one packed forward give each what it gets alone."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import make_prompt_cache

from app.engine.packed import packable, packed_forward
from tests.engine.families import cache_of, tiny_model

PROMPTS = [list(range(5, 22)), list(range(40, 43)), list(range(100, 160))]
NEW = [[7, 8, 9, 10, 11], [44], [161, 162, 163, 170, 171, 172, 173, 174, 175]]


@pytest.mark.parametrize(
    ("model_type", "tied", "fused"), [("llama", False, False), ("qwen2", True, True)]
)
def test_each_sequence_gets_what_it_gets_alone(model_type: str, tied: bool, fused: bool) -> None:
    model = tiny_model(model_type, tied, fused)
    alone, together = [], []
    for prompt, new in zip(PROMPTS, NEW, strict=True):
        cache = cache_of(model, prompt)
        alone.append((model(mx.array(new)[None], cache=cache), cache))
    caches = [cache_of(model, p) for p in PROMPTS]
    together = packed_forward(model, NEW, caches)
    for (want, want_cache), got, cache, new in zip(alone, together, caches, NEW, strict=True):
        assert got.shape == (1, len(new), want.shape[-1])
        assert mx.allclose(got, want, atol=1e-4).item()
        assert [c.offset for c in cache] == [c.offset for c in want_cache]
    # The caches go on as they would alone: the next step agrees too.
    nxt = [[3], [4, 5], [6]]
    again = packed_forward(model, nxt, caches)
    for (_, want_cache), got, new in zip(alone, again, nxt, strict=True):
        want = model(mx.array(new)[None], cache=want_cache)
        assert mx.allclose(got, want, atol=1e-4).item()


def test_what_cannot_be_packed_is_refused() -> None:
    model = tiny_model("llama")
    assert packable(model)
    assert not packable(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="cannot be packed"):
        packed_forward(nn.Linear(2, 2), [[1]], [[]])
    with pytest.raises(ValueError, match="at least one token"):
        packed_forward(model, [[1], []], [make_prompt_cache(model), make_prompt_cache(model)])
    with pytest.raises(ValueError, match="at least one token"):
        packed_forward(model, [[1]], [])
