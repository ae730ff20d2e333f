"""The target's caches kept side by side: each round what packed verification gives."""

from __future__ import annotations

import random

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from app.engine import load_pair
from app.engine.attention import BUCKET
from app.engine.packed import packed_forward
from app.engine.side_by_side import SideBySide
from app.engine.stacked import stacked_step
from tests.conftest import TinyModels

PROMPTS = [list(range(40, 70)), list(range(100, 121)), list(range(5, 30))]


@pytest.fixture(scope="module")
def target(tiny: TinyModels):
    return load_pair(tiny.target).target.model


def _caches(model, prompts: list[list[int]]) -> list[list]:
    caches = [make_prompt_cache(model) for _ in prompts]
    mx.eval(packed_forward(model, prompts, caches), [c.state for cache in caches for c in cache])
    return caches


def test_rounds_side_by_side_match_packed_rounds_through_compactions_and_growth(target) -> None:
    apart = _caches(target, PROMPTS)
    side = SideBySide(_caches(target, PROMPTS), room=8)  # few columns: it compacts and grows
    rnd = random.Random(0)
    tokens: list[int | float | complex] = [p[-1] for p in PROMPTS]
    for n in range(100):
        widths = [rnd.randint(1, 6) for _ in PROMPTS]  # ragged: a shorter one pads its front
        rows = [
            mx.array([t, *range(200 + n, 200 + n + w - 1)], dtype=mx.int32)
            for t, w in zip(tokens, widths, strict=True)
        ]
        want = packed_forward(target, rows, apart)
        out = stacked_step(target, rows, side)
        r = out.shape[1]
        for j, (lg, w) in enumerate(zip(want, widths, strict=True)):
            np.testing.assert_allclose(np.array(out[j, r - w :]), np.array(lg[0]), atol=1e-4)
        kept = [rnd.randint(1, w) for w in widths]
        for c, w, k in zip(apart, widths, kept, strict=True):
            trim_prompt_cache(c, w - k)
        side.settle(kept)
        tokens = [row[k - 1].item() for row, k in zip(rows, kept, strict=True)]
    assert side.compactions > 0 and side.size > BUCKET  # both ran


def test_restore_gives_each_sequence_its_kept_rows_in_order(target) -> None:
    apart = _caches(target, PROMPTS)
    stacked = _caches(target, PROMPTS)
    side = SideBySide(stacked, room=8)
    assert all(c.keys is None for cache in stacked for c in cache)  # one copy while stacked
    rnd = random.Random(1)
    for n in range(12):
        rows = [mx.array([3 + n, 4, 5, 6], dtype=mx.int32) for _ in PROMPTS]
        packed_forward(target, rows, apart)
        stacked_step(target, rows, side)
        kept = [rnd.randint(1, 4) for _ in PROMPTS]
        for c, k in zip(apart, kept, strict=True):
            trim_prompt_cache(c, 4 - k)
        side.settle(kept)
    side.restore(stacked)
    for mine, theirs in zip(stacked, apart, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            assert a.offset == b.offset
            for x, y in ((a.keys, b.keys), (a.values, b.values)):
                n = a.offset
                np.testing.assert_allclose(
                    np.array(x[..., :n, :]), np.array(y[..., :n, :]), atol=1e-5
                )
