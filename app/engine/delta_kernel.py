"""The Gated DeltaNet recurrence as one CUDA kernel that keeps each row's state.

Off Metal mlx-lm runs the recurrence a row at a time in a handful of array
operations each (its kernel is Metal's; MLX's own ``mx.fast.gated_delta_update``
has no CUDA implementation). On an H200 that made a Qwen3.5-0.8B-shaped draft
step launch-bound and a 27B-shaped target's 16-row verification 3.6 times a
1-row step. This kernel is mlx-lm's Metal kernel written for CUDA: a warp per
value row, the key dimension split over its lanes, the rows in order. It also
writes the state after every row, which a verification keeps so that going
back costs a lookup (:mod:`app.engine.recurrent`).

A row's arithmetic is the same whatever the rows around it, so a one-row step
and a verification of m rows agree to the bit, as Metal's kernel does; against
mlx-lm's array operations its sums run in another order (float32 rounding).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any, overload

import mlx.core as mx

_SOURCE = """
    const int rows = q_shape[1];
    const int n = blockIdx.z;
    const int b = n / Hv;
    const int hv = n % Hv;
    const int hk = hv / (Hv / Hk);
    const int dv = blockIdx.y * blockDim.y + threadIdx.y;
    const int lane = threadIdx.x;
    if (dv >= Dv) return;
    constexpr int per = Dk / 32;

    const InT* q_ = q + (size_t)b * rows * Hk * Dk + hk * Dk;
    const InT* k_ = k + (size_t)b * rows * Hk * Dk + hk * Dk;
    const InT* v_ = v + (size_t)b * rows * Hv * Dv + hv * Dv;
    const GT* g_ = g + (size_t)b * rows * Hv;
    const BT* beta_ = beta + (size_t)b * rows * Hv;
    InT* y_ = y + (size_t)b * rows * Hv * Dv + hv * Dv;
    const StT* s_in = state_in + ((size_t)n * Dv + dv) * Dk;
    StT* s_out = states + (Keep ? (((size_t)b * (rows - 1) * Hv + hv) * Dv + dv) * Dk : 0);
    StT* s_last = state_out + ((size_t)n * Dv + dv) * Dk;

    float s[per];
    for (int i = 0; i < per; ++i) {
      s[i] = static_cast<float>(s_in[per * lane + i]);
    }
    for (int t = 0; t < rows; ++t) {
      const float decay = static_cast<float>(g_[hv]);
      float kv = 0.0f;
      for (int i = 0; i < per; ++i) {
        s[i] = s[i] * decay;
        kv += s[i] * static_cast<float>(k_[per * lane + i]);
      }
      for (int o = 16; o > 0; o >>= 1) kv += __shfl_xor_sync(0xffffffff, kv, o);
      const float delta =
          (static_cast<float>(v_[dv]) - kv) * static_cast<float>(beta_[hv]);
      float out = 0.0f;
      for (int i = 0; i < per; ++i) {
        s[i] = s[i] + static_cast<float>(k_[per * lane + i]) * delta;
        out += s[i] * static_cast<float>(q_[per * lane + i]);
        if (Keep && t < rows - 1) s_out[per * lane + i] = static_cast<StT>(s[i]);
      }
      for (int o = 16; o > 0; o >>= 1) out += __shfl_xor_sync(0xffffffff, out, o);
      if (lane == 0) y_[dv] = static_cast<InT>(out);
      q_ += Hk * Dk;
      k_ += Hk * Dk;
      v_ += Hv * Dv;
      y_ += Hv * Dv;
      g_ += Hv;
      beta_ += Hv;
      if (Keep) s_out += (size_t)Hv * Dv * Dk;
    }
    for (int i = 0; i < per; ++i) {
      s_last[per * lane + i] = static_cast<StT>(s[i]);
    }
"""

_ROWS_PER_BLOCK = 4  # value rows (warps) per block


def available() -> bool:
    """Whether the kernel runs here: MLX's CUDA backend is the default device."""
    return mx.default_device() == mx.gpu and mx.cuda.is_available()


def fits(q: mx.array, v: mx.array, g: mx.array, mask: mx.array | None) -> bool:
    """Whether the kernel takes these inputs: scalar gating, no mask, lanes' share whole."""
    dk, hk, hv = q.shape[-1], q.shape[-2], v.shape[-2]
    return mask is None and g.ndim == 3 and dk % 32 == 0 and hv % hk == 0


@cache
def _kernel() -> Any:
    return mx.fast.cuda_kernel(
        name="tandem_gated_delta_rows",
        input_names=["q", "k", "v", "g", "beta", "state_in"],
        output_names=["y", "state_out", "states"],
        source=_SOURCE,
    )


def gated_delta_rows(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array,
    keep: bool,
) -> tuple[mx.array, Sequence[mx.array]]:
    """The recurrence over ``q``'s rows from ``state``: its output and states.

    Shapes as mlx-lm's ``gated_delta_ops``: q, k ``[B, T, Hk, Dk]``, v ``[B, T, Hv, Dv]``,
    g and beta ``[B, T, Hv]``, state ``[B, Hv, Dv, Dk]``; :func:`fits` says which it takes.

    Returns:
        The output, and the state after each row where ``keep``, else after the last.
    """
    b, rows, hk, dk = q.shape
    hv, dv = v.shape[-2:]
    kept = rows - 1 if keep else 0
    y, last, states = _kernel()(
        inputs=[q, k, v, g, beta, state],
        template=[
            ("InT", q.dtype),
            ("GT", g.dtype),
            ("BT", beta.dtype),
            ("StT", state.dtype),
            ("Dk", dk),
            ("Dv", dv),
            ("Hk", hk),
            ("Hv", hv),
            ("Keep", kept > 0),
        ],
        grid=(32, dv, b * hv),
        threadgroup=(32, _ROWS_PER_BLOCK, 1),
        output_shapes=[(b, rows, hv, dv), state.shape, (b, kept, hv, dv, dk) if kept else (1,)],
        output_dtypes=[q.dtype, state.dtype, state.dtype],
    )
    return y, _Rows(states, last, kept + 1) if keep else [last]


class _Rows(Sequence[mx.array]):
    """The state after each row: the last its own array, the others read out of one buffer.

    A state read out is a copy, so that a cache gone back to it does not hold
    the buffer of every row's state (a 27B's 16 rows: 2.4 GB) beyond its forward.
    """

    def __init__(self, states: mx.array, last: mx.array, rows: int) -> None:
        self._states, self._last, self._rows = states, last, rows

    def __len__(self) -> int:
        return self._rows

    @overload
    def __getitem__(self, i: int) -> mx.array: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[mx.array]: ...
    def __getitem__(self, i: int | slice) -> mx.array | Sequence[mx.array]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._rows))]
        i = range(self._rows)[i]
        return self._last if i == self._rows - 1 else self._states[:, i] * 1
