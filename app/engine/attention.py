"""Shape-stable attention for verification.

Verification attends k + 1 queries over the whole KV cache, whose length changes
every round. On MLX's CUDA backend kernels are built anew for every new key
length (about 70 ms against 12 ms for a length seen before). Two remedies, for
short multi-token queries only (single-token steps and long prefills keep
mlx-lm's path):

- ``bucketed``: attend over the cache's buffer rounded up to a multiple of 256
  (the buffer grown to it where shorter) and mask the tail, so the key length
  takes few values;
- ``matmul``: the same through plain matmuls instead of the fused kernel.

Prompts meet the same builds: in either mode a prompt chunk is read padded to
a multiple of :data:`ROWS` rows (:func:`padding`), the pad cut off after.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn

Mode = Literal["auto", "sdpa", "bucketed", "matmul"]
MAX_QUERIES = 32  # a verification of up to 16 drafts, padded
BUCKET = 256
ROWS = 64  # a prompt chunk's rows, padded to a multiple of this where shapes cost builds
_state: dict[str, str] = {}  # the mode, resolved on first use unless set


def matmul_attention(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Any
) -> mx.array:
    """Scaled dot-product attention with grouped KV heads, as plain matmuls.

    Args:
        queries: ``(B, Hq, L, D)``.
        keys: ``(B, Hkv, S, D)``; the last ``L`` keys belong to the queries.
        values: ``(B, Hkv, S, Dv)``.
        scale: Factor applied to the queries.
        mask: ``None``, ``"causal"``, a boolean mask (True attends) or an additive one.
    """
    b, hq, length, d = queries.shape
    hkv, s = keys.shape[1], keys.shape[2]
    q = (queries * scale).reshape(b, hkv, hq // hkv, length, d)
    scores = q @ mx.expand_dims(keys, 2).swapaxes(-1, -2)
    if isinstance(mask, str):
        allowed = mx.arange(s)[None, :] <= mx.arange(length)[:, None] + (s - length)
        scores = mx.where(allowed, scores, -mx.inf)
    elif mask is not None:
        m = mx.expand_dims(mask, 2) if mask.ndim == 4 else mask
        scores = mx.where(m, scores, -mx.inf) if m.dtype == mx.bool_ else scores + m
    weights = mx.softmax(scores.astype(mx.float32), axis=-1).astype(values.dtype)
    out = weights @ mx.expand_dims(values, 2)
    return out.reshape(b, hq, length, values.shape[-1])


def align(cache: Any, size: int) -> None:
    """Grows ``cache``'s buffers to ``size`` columns where they are shorter.

    mlx-lm grows a cache 256 columns past its offset, so a cache trimmed
    between rounds gets buffers of any length, and attending over one
    would give each request a key length of its own. On MLX's CUDA backend
    a lone request's round that grew its caches so took 1.1 s on a 70B,
    against 0.12 s for the others (run 22 in docs/benchmarks-history.md).
    """
    more = size - cache.keys.shape[2]
    if more > 0:
        pad = [(0, 0), (0, 0), (0, more), (0, 0)]
        cache.keys, cache.values = mx.pad(cache.keys, pad), mx.pad(cache.values, pad)


def bucketed_attention(
    queries: mx.array, cache: Any, scale: float, matmul: bool = False
) -> mx.array:
    """Attention of the newest ``L`` tokens over a bucketed view of ``cache``."""
    length, s = queries.shape[2], cache.offset
    size = -(-s // BUCKET) * BUCKET
    align(cache, size)
    keys, values = cache.keys[..., :size, :], cache.values[..., :size, :]
    allowed = mx.arange(size)[None, :] <= mx.arange(length)[:, None] + (s - length)
    if matmul:
        return matmul_attention(queries, keys, values, scale, allowed)
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=allowed)


def padding(n: int, cache: Sequence[Any]) -> int:
    """Rows to read after a prompt chunk of ``n`` rows so that its shapes repeat.

    On the H200 a 70B read a prompt of a length never seen before in 300 ms
    against 263 ms at a seen one, its 1B draft in 45 against 9 ms (run 23 in
    docs/benchmarks-history.md); padded to a multiple of :data:`ROWS` the reads cost
    the same and every later length reuses their kernels. The pad comes after
    the real rows, so causal attention keeps them exact, and the caller cuts
    it off the cache. Only where verification buckets (the mode is not
    ``sdpa``), and only over plain KV caches, which cut back exactly.
    """
    from mlx_lm.models.cache import KVCache

    if mode() == "sdpa" or not all(type(c) is KVCache for c in cache):
        return 0
    return -n % ROWS


def padded(tokens: Sequence[int], cache: Sequence[Any]) -> tuple[list[int], int]:
    """``tokens`` with :func:`padding`'s rows after them (copies of the last), and their count."""
    rows = list(tokens)
    pad = padding(len(rows), cache)
    return rows + rows[-1:] * pad, pad


def resolve(mode: Mode) -> str:
    """The concrete mode on this machine: ``auto`` buckets on CUDA only."""
    if mode == "auto":
        return "bucketed" if mx.default_device() == mx.gpu and mx.cuda.is_available() else "sdpa"
    return mode


def set_mode(mode: Mode) -> None:
    _state["mode"] = resolve(mode)


def mode() -> str:
    """The concrete mode: ``auto`` resolved on this machine unless :func:`set_mode` chose."""
    now = _state.get("mode")
    if now is None:  # resolved once: every layer of every forward asks
        now = _state["mode"] = resolve("auto")
    return now


def install(model: nn.Module) -> None:
    """Wraps the attention function of ``model``'s mlx-lm module (idempotent)."""
    module = sys.modules.get(type(model).__module__)
    original = getattr(module, "scaled_dot_product_attention", None)
    if module is None or original is None or getattr(original, "_tandem", False):
        return

    from mlx_lm.models.cache import KVCache

    def attention(
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        cache: Any,
        scale: float,
        mask: Any,
        sinks: Any = None,
    ) -> mx.array:
        now = mode()
        if (
            now != "sdpa"
            and sinks is None
            and type(cache) is KVCache
            and (mask is None or isinstance(mask, str))
            and 1 < queries.shape[2] <= MAX_QUERIES
        ):
            return bucketed_attention(queries, cache, scale, matmul=now == "matmul")
        out: mx.array = original(queries, keys, values, cache, scale, mask, sinks=sinks)
        return out

    attention._tandem = True  # type: ignore[attr-defined]
    setattr(module, "scaled_dot_product_attention", attention)  # noqa: B010
