"""Steps of several sequences side by side give each what it gets alone."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from app.engine.stacked import Stack, stackable, stacked_step
from tests.engine.families import cache_of, tiny_model

PROMPTS = [list(range(5, 22)), list(range(40, 49)), list(range(100, 130))]
STEPS = [[7, 8, 9], [44, 45, 46], [161, 162, 163]]


@pytest.mark.parametrize(("model_type", "fused"), [("llama", False), ("qwen2", True)])
def test_each_sequence_steps_as_it_would_alone(model_type: str, fused: bool) -> None:
    model = tiny_model(model_type, fused=fused)
    alone = []
    for prompt, tokens in zip(PROMPTS, STEPS, strict=True):
        cache = cache_of(model, prompt)
        alone.append([model(mx.array([t])[None], cache=cache)[0, -1] for t in tokens])
    caches = [cache_of(model, p) for p in PROMPTS]
    assert stackable(model, caches)
    stack = Stack(caches, columns=len(STEPS[0]))
    for step in range(len(STEPS[0])):
        logits = stacked_step(model, [mx.array([s[step]]) for s in STEPS], stack)
        assert logits.shape[:2] == (len(PROMPTS), 1)
        for j, want in enumerate(alone):
            assert mx.allclose(logits[j, -1], want[step], atol=1e-4).item(), (step, j)
    # Each sequence takes back as many rows as it keeps, and goes on as it would alone.
    kept = [3, 1, 2]
    stack.write_back(caches, kept)
    assert [c[0].offset for c in caches] == [len(p) + n for p, n in zip(PROMPTS, kept, strict=True)]
    for prompt, tokens, cache, n in zip(PROMPTS, STEPS, caches, kept, strict=True):
        ref = cache_of(model, prompt + tokens[:n])
        want = model(mx.array([1])[None], cache=ref)
        got = model(mx.array([1])[None], cache=cache)
        assert mx.allclose(got, want, atol=1e-4).item()


def test_only_plain_caches_of_several_sequences_stack() -> None:
    model = tiny_model("llama")
    one = [cache_of(model, PROMPTS[0])]
    assert stackable(model)
    assert not stackable(model, one)  # nothing to gain from a stack of one
    assert not stackable(model, [*one, make_prompt_cache(model)])  # an empty cache
    # One far longer than the rest: its padding would make the stack past SLACK its size.
    short = [cache_of(model, [5, 6]) for _ in range(3)]
    assert stackable(model, [cache_of(model, list(range(5, 9))), *short])
    assert not stackable(model, [cache_of(model, list(range(5, 60))), *short])


def test_a_stack_refuses_more_steps_than_it_has_room_for() -> None:
    model = tiny_model("llama")
    stack = Stack([cache_of(model, p) for p in PROMPTS[:2]], columns=1)
    stack.taken = stack.size - stack.base
    with pytest.raises(ValueError, match="no column"):
        stacked_step(model, [mx.array([1]), mx.array([2])], stack)


def test_a_first_step_of_different_rows_per_sequence_gives_each_its_own() -> None:
    model = tiny_model("qwen2", fused=True)
    first = [[7, 8], [44], [161, 162, 163]]  # what each committed in the last round
    then = [[9, 10], [45, 46], [164, 165]]
    alone = []
    for prompt, a, b in zip(PROMPTS, first, then, strict=True):
        cache = cache_of(model, prompt)
        rows = [model(mx.array(a)[None], cache=cache)[0, -1]]
        rows += [model(mx.array([t])[None], cache=cache)[0, -1] for t in b]
        alone.append(rows)
    caches = [cache_of(model, p) for p in PROMPTS]
    stack = Stack(caches, columns=3 + 2)
    got = [stacked_step(model, [mx.array(a) for a in first], stack)[:, -1]]
    for step in range(2):
        got.append(stacked_step(model, [mx.array([b[step]]) for b in then], stack)[:, -1])
    for step, logits in enumerate(got):
        for j, want in enumerate(alone):
            assert mx.allclose(logits[j], want[step], atol=1e-4).item(), (step, j)
    with pytest.raises(ValueError, match="first step"):
        stacked_step(model, [mx.array([1]), mx.array([2, 3]), mx.array([4])], stack)
    # Each keeps its own new rows, contiguous: what it was fed and its first later step.
    kept = [len(a) + 1 for a in first]
    stack.write_back(caches, kept)
    for prompt, a, b, cache, n in zip(PROMPTS, first, then, caches, kept, strict=True):
        ref = cache_of(model, prompt + (a + b)[:n])
        assert cache[0].offset == len(prompt) + n
        want = model(mx.array([1])[None], cache=ref)
        assert mx.allclose(model(mx.array([1])[None], cache=cache), want, atol=1e-4).item()
