"""Tandem's speculative decoding loop.

A round drafts ``k`` tokens with the draft model, verifies them with one target
forward of ``k + 1`` tokens and keeps the longest accepted prefix plus one token
from the target. At temperature 0 the output is the target's greedy output; above
0 the accept/resample rule of Leviathan et al. (2023) keeps the target's
distribution exactly.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from app.engine.types import Origin

PREFILL_STEP = 512


@dataclass(frozen=True, slots=True)
class Round:
    """What one round committed to the reply."""

    tokens: tuple[int, ...]
    origins: tuple[Origin, ...]
    drafted: int
    accepted: int


def prefill(model: nn.Module, cache: list[Any], tokens: Sequence[int]) -> None:
    """Runs ``tokens`` through ``model`` into ``cache`` in chunks."""
    for i in range(0, len(tokens), PREFILL_STEP):
        model(mx.array(list(tokens[i : i + PREFILL_STEP]))[None], cache=cache)
        mx.eval([c.state for c in cache])


def _ints(a: mx.array) -> list[int]:
    return cast(list[int], a.tolist())


def _int(a: mx.array) -> int:
    return int(cast(int, a.item()))


def _logits(model: nn.Module, tokens: mx.array, cache: list[Any]) -> mx.array:
    return model(tokens[None], cache=cache)[0].astype(mx.float32)


def _sample(logits: mx.array, temperature: float) -> mx.array:
    if temperature == 0:
        return mx.argmax(logits, axis=-1)
    return mx.random.categorical(logits / temperature)


def speculative_rounds(
    target: nn.Module,
    prompt: Sequence[int],
    *,
    draft: nn.Module | None = None,
    num_draft: int = 4,
    temperature: float = 0.0,
) -> Generator[Round, None, None]:
    """Yields the tokens of a reply round by round, without end.

    The first round is empty: it marks the end of prompt processing. The caller
    stops pulling on end of sequence, length or cancellation, so cancellation is
    checked between any two rounds.

    Args:
        target: The model whose output is produced.
        prompt: Prompt token ids (at least one).
        draft: Optional draft model sharing the target's vocabulary.
        num_draft: Draft tokens per round; 0 or no draft means plain decoding.
        temperature: 0 for greedy, above 0 for sampling.
    """
    t_cache = make_prompt_cache(target)
    prefill(target, t_cache, prompt[:-1])
    d_cache: list[Any] = []
    k = num_draft if draft is not None else 0
    if draft is not None and k > 0:
        d_cache = make_prompt_cache(draft)
        prefill(draft, d_cache, prompt[:-1])
    last = mx.array(list(prompt[-1:]))
    pending = last  # tokens the draft has yet to see
    yield Round((), (), 0, 0)

    while True:
        if draft is None or k == 0:
            token = _sample(_logits(target, last, t_cache)[-1], temperature)
            t = _int(token)
            last = mx.array([t])
            yield Round((t,), (Origin.TARGET,), 0, 0)
            continue

        # Draft k tokens, lazily; one evaluation covers draft and verify.
        drafted: list[mx.array] = []
        q_probs: list[mx.array] = []
        x = pending
        for _ in range(k):
            logits = _logits(draft, x, d_cache)[-1]
            if temperature == 0:
                x = mx.argmax(logits, keepdims=True)
            else:
                logits = logits / temperature
                x = mx.random.categorical(logits)[None]
                q_probs.append(mx.softmax(logits))
            drafted.append(x)
        proposal = mx.concatenate(drafted)
        v_logits = _logits(target, mx.concatenate([last, proposal]), t_cache)

        if temperature == 0:
            choice = mx.argmax(v_logits, axis=-1)
            mx.eval(proposal, choice)
            d, c = _ints(proposal), _ints(choice)
            n = 0
            while n < k and d[n] == c[n]:
                n += 1
            t = c[n]
        else:
            p = mx.softmax(v_logits / temperature, axis=-1)
            q = mx.stack(q_probs)
            idx = mx.arange(k)
            p_x, q_x = p[idx, proposal], q[idx, proposal]
            # Accept x with probability min(1, p(x) / q(x)).
            accept = mx.random.uniform(shape=(k,)) * q_x < p_x
            mx.eval(proposal, accept)
            d, ok = _ints(proposal), cast(list[bool], accept.tolist())
            n = ok.index(False) if False in ok else k
            if n < k:
                residual = mx.maximum(p[n] - q[n], 0.0)
                t = _int(mx.random.categorical(mx.log(residual)))
            else:
                t = _int(mx.random.categorical(mx.log(p[k])))

        trim_prompt_cache(t_cache, k - n)
        if n < k:
            trim_prompt_cache(d_cache, k - 1 - n)
            pending = mx.array([t])
        else:
            pending = mx.array([d[k - 1], t])
        last = mx.array([t])
        origin = Origin.BONUS if n == k else Origin.CORRECTION
        yield Round((*d[:n], t), (Origin.DRAFT,) * n + (origin,), k, n)
