"""The CUDA Gated DeltaNet kernel: which inputs it takes, and (on CUDA) its values."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models import gated_delta

from app.engine import delta_kernel


def _reference(q, k, v, g, beta, state):  # type: ignore[no-untyped-def]
    """mlx-lm's recurrence, a row at a time through its own step."""
    repeat = v.shape[-2] // q.shape[-2]
    q, k = mx.repeat(q, repeat, -2), mx.repeat(k, repeat, -2)
    ys = []
    for t in range(q.shape[1]):
        y, state = gated_delta._gated_delta_step_ops(
            q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state
        )
        ys.append(y)
    return mx.stack(ys, axis=1), state


def _inputs(rows: int, batch: int = 1, hk: int = 2, d: int = 32, hv: int = 4):  # type: ignore[no-untyped-def]
    mx.random.seed(rows)
    q = mx.random.normal((batch, rows, hk, d)) * 0.2
    k = mx.random.normal((batch, rows, hk, d)) * 0.2
    v = mx.random.normal((batch, rows, hv, d))
    g = mx.random.uniform(0.85, 1.0, (batch, rows, hv))
    beta = mx.sigmoid(mx.random.normal((batch, rows, hv)))
    state = mx.random.normal((batch, hv, d, d)) * 0.05
    return q, k, v, g, beta, state


def test_it_takes_scalar_gates_unmasked_and_whole_lane_shares() -> None:
    q, _, v, g, _, _ = _inputs(3)
    assert delta_kernel.fits(q, v, g, None)
    assert not delta_kernel.fits(q, v, g, mx.ones((1, 3), dtype=mx.bool_))  # padded batch
    assert not delta_kernel.fits(q, v, mx.ones((*g.shape, 32)), None)  # a gate per key (Kimi)
    narrow, _, _, _, _, _ = _inputs(3, d=16)
    assert not delta_kernel.fits(narrow, v, g, None)  # 16 keys cannot split over 32 lanes


@pytest.mark.skipif(not delta_kernel.available(), reason="MLX's CUDA backend is not in use")
@pytest.mark.parametrize(("batch", "rows"), [(1, 1), (1, 5), (2, 17), (1, 40)])
def test_on_cuda_it_is_mlx_lms_recurrence_and_a_row_is_the_same_alone(batch, rows) -> None:
    q, k, v, g, beta, state = _inputs(rows, batch)
    want_y, want_state = _reference(q, k, v, g, beta, state)
    keep = rows <= 17
    y, states = delta_kernel.gated_delta_rows(q, k, v, g, beta, state, keep)
    assert mx.allclose(y, want_y, atol=1e-4) and mx.allclose(states[-1], want_state, atol=1e-5)
    assert len(states) == (rows if keep else 1)
    now, ys = state, []
    for t in range(rows):  # one row at a time, as plain decoding runs it
        a, b, c, d, e = (x[:, t : t + 1] for x in (q, k, v, g, beta))
        y1, after = delta_kernel.gated_delta_rows(a, b, c, d, e, now, True)
        if keep:
            assert mx.array_equal(after[-1], states[t])
        now = after[-1]
        ys.append(y1)
    assert mx.array_equal(mx.concatenate(ys, axis=1), y) and mx.array_equal(now, states[-1])
