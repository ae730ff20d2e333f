"""Sampler transforms shared by the target and the draft.

Lossless speculative sampling needs the same transforms on both models'
distributions, so both go through :func:`log_probs`. The filters are mlx-lm's
own (``apply_top_k``, ``apply_top_p``, ``apply_min_p``); the order is mlx-lm's:
repetition penalty on logits, filters on log-probabilities, then temperature.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from typing import Literal

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from app.engine.types import GenerationParams

Role = Literal["pick", "verify"]


class Draws:
    """One request's random draws, each keyed by its seed and the position drawn for.

    Nothing is drawn from MLX's global generator, so no request's draws
    depend on another's or on how the rounds fell. A seeded request samples
    each position as plain decoding would, by the Gumbel-max trick with that
    position's noise; its drafts are drawn against the same noise and kept
    while they equal the target's own draws (coupled). Its reply is then the
    one plain decoding gives with that seed, whatever was drafted, at any k
    or on Auto, alone or among others, though it accepts fewer drafts than
    rejection sampling. An unseeded request gets a seed of its own, never
    shared, and rejection sampling.
    """

    def __init__(self, seed: int | None) -> None:
        self.coupled = seed is not None
        self.seed = seed if seed is not None else secrets.randbits(63)

    def key(self, position: int, role: Role = "pick") -> mx.array:
        digest = hashlib.blake2b(f"{self.seed}:{position}:{role}".encode(), digest_size=8)
        return mx.random.key(int.from_bytes(digest.digest(), "little"))

    def noise(self, position: int, rows: int, vocab: int) -> mx.array:
        """Gumbel noise of ``rows`` positions from ``position`` on: ``(rows, vocab)``."""
        return mx.stack(
            [mx.random.gumbel(shape=(vocab,), key=self.key(position + i)) for i in range(rows)]
        )


def penalize(logits: mx.array, contexts: Sequence[mx.array], penalty: float) -> mx.array:
    """Applies the repetition penalty of CTRL (Keskar et al. 2019) row by row.

    Args:
        logits: ``(n, V)`` logits.
        contexts: For each row, the token ids (at most the context size) it penalises.
        penalty: Factor above 1 that makes repeated tokens less likely.
    """
    if penalty == 1.0 or not contexts:
        return logits
    vocab = logits.shape[-1]
    rows = []
    for i, ctx in enumerate(contexts):
        if ctx.size == 0:
            rows.append(logits[i])
            continue
        hit = mx.zeros((vocab,), dtype=mx.int32).at[ctx].add(1) > 0
        row = logits[i]
        rows.append(mx.where(hit, mx.where(row < 0, row * penalty, row / penalty), row))
    return mx.stack(rows)


def log_probs(logits: mx.array, params: GenerationParams) -> mx.array:
    """Log-probabilities after the filters and the temperature (``temperature > 0``)."""
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    vocab = lp.shape[-1]
    if 0 < params.top_p < 1.0:
        lp = apply_top_p(lp, params.top_p)
    if params.min_p > 0.0:
        lp = apply_min_p(lp, params.min_p)
    if 0 < params.top_k < vocab:
        lp = apply_top_k(lp, params.top_k)
    lp = lp * (1.0 / params.temperature)
    return lp - mx.logsumexp(lp, axis=-1, keepdims=True)


def contexts_for(history: mx.array, proposal: mx.array, rows: int, size: int) -> list[mx.array]:
    """Penalty contexts of ``rows`` consecutive positions.

    Row ``i`` sees ``history`` followed by the first ``i`` proposed tokens, cut
    to the last ``size`` tokens, exactly as plain decoding would at that position.
    """
    out = []
    for i in range(rows):
        ctx = mx.concatenate([history, proposal[:i]]) if i else history
        out.append(ctx[-size:] if size > 0 else ctx[:0])
    return out
