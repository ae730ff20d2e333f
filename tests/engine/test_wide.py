"""Wide forwards on dequantized weights: when they dequantize, what they compute, who measures."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import make_prompt_cache

from app.engine import fuse, wide
from app.engine.decoder import Decoder, take_turns
from app.engine.options import EngineOptions
from app.engine.types import DraftSetting, GenerationParams
from app.testing import synthetic as syn


@pytest.fixture(autouse=True)
def _auto_after() -> Iterator[None]:
    yield
    wide.set_mode("auto")


def _model(miss: float = 0.0, seed: int = 0, bits: int | None = 4) -> nn.Module:
    model = syn.build("tiny", miss=miss, seed=seed, bits=bits, dtype=mx.float32)
    fuse.fuse(model)
    return model


def _projections(model: nn.Module) -> list[fuse.FusedProjection]:
    return [m for _, m in model.named_modules() if isinstance(m, fuse.FusedProjection)]


def _dequantizes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The shape of every weight matrix dequantized from now on (not embedding rows)."""
    seen: list[tuple[int, ...]] = []
    real = mx.dequantize

    def spy(w: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        out = real(w, *args, **kwargs)
        if out.ndim == 2:
            seen.append(tuple(out.shape))
        return out

    monkeypatch.setattr(mx, "dequantize", spy)
    return seen


def test_fusing_a_quantized_model_makes_every_layer_projection_one() -> None:
    model = _model()
    layer = model.layers[0]
    assert isinstance(layer.self_attn.o_proj, fuse.FusedProjection)
    assert isinstance(layer.mlp.down_proj, fuse.FusedProjection)
    # Per layer: q/k/v, o, gate/up and down.
    assert len(_projections(model)) == 4 * len(model.layers)
    plain = _model(bits=None)
    assert isinstance(plain.layers[0].self_attn.o_proj, nn.Linear)


def test_a_forward_dequantizes_from_the_width_set_and_computes_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _model()
    wide.set_mode(64)
    assert wide.install(model) == 64
    x = mx.array(syn.prompt("tiny", repeats=8)[:64])[None]
    seen = _dequantizes(monkeypatch)
    monkeypatch.setattr(wide, "_queued", [0])
    evals: list[int] = []
    real_eval = mx.eval

    def counted(*arrays: Any) -> None:
        evals.append(len(seen))
        real_eval(*arrays)

    monkeypatch.setattr(mx, "eval", counted)
    dequantized = model(x, cache=make_prompt_cache(model))
    # One layer's dequantized weights may wait: evaluated after each layer's last (down).
    n = 4 * len(model.layers)
    assert evals == list(range(4, n + 1, 4))
    first = model.layers[0]
    parts = (first.self_attn.q_k_v_fused, first.self_attn.o_proj, first.mlp.gate_up_fused,
             first.mlp.down_proj)  # fmt: skip
    layer = sum(p["scales"].size * p.group_size * 4 for p in parts)  # float32 weights
    assert {p.queue for p in _projections(model)} == {layer}
    for p in _projections(model):
        p.queue = 1  # each projection evaluated before the next is dequantized
    model(x, cache=make_prompt_cache(model))
    assert evals[n // 4 :] == list(range(n + 1, 2 * n + 1))
    monkeypatch.setattr(mx, "eval", real_eval)
    mx.eval(dequantized)
    assert len(seen) == 8 * len(model.layers)

    narrow = model(x[:, :63], cache=make_prompt_cache(model))
    mx.eval(narrow)
    assert len(seen) == 8 * len(model.layers)  # 63 rows: the 4-bit kernel

    wide.set_mode("off")
    assert wide.install(model) is None
    kernel = model(x, cache=make_prompt_cache(model))
    assert len(seen) == 8 * len(model.layers)
    assert mx.allclose(dequantized, kernel, atol=1e-3).item()


def test_install_measures_each_model_once_per_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[nn.Module] = []

    def measure(model: nn.Module) -> int:
        calls.append(model)
        return 128

    monkeypatch.setattr(wide, "measure", measure)
    model = _model()
    assert wide.install(model) == wide.install(model) == 128
    assert calls == [model]
    assert {p.wide for p in _projections(model)} == {128}
    wide.set_mode("off")
    assert wide.install(model) is None
    assert {p.wide for p in _projections(model)} == {None}


def _fake_seconds(
    kernel_per_row: float, timed: list[tuple[int, int | None]]
) -> Callable[..., float]:
    """Times the 4-bit kernel in proportion to the rows and dequantizing as flat."""

    def seconds(run: functools.partial[list[mx.array]]) -> float:
        xs, _, width = run.args
        rows = int(xs[0].shape[1])
        timed.append((rows, width))
        return rows * kernel_per_row if width is None else 0.1

    return seconds


def test_measure_stops_at_the_narrowest_width_where_dequantizing_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timed: list[tuple[int, int | None]] = []
    monkeypatch.setattr(wide, "_seconds", _fake_seconds(1e-3, timed))
    # Dequantizing (0.1 s) saves a tenth of the kernel's time from 112 rows on.
    assert wide.measure(_model()) == 128
    assert timed == [(64, None), (64, 1), (128, None), (128, 1)]  # nothing wider was timed

    timed.clear()
    monkeypatch.setattr(wide, "_seconds", _fake_seconds(1e-4, timed))
    assert wide.measure(_model()) is None  # the kernel keeps up to 512 rows
    assert [r for r, _ in timed] == [64, 64, 128, 128, 256, 256, 512, 512]


def test_a_model_without_quantized_projections_is_not_timed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timed: list[tuple[int, int | None]] = []
    monkeypatch.setattr(wide, "_seconds", _fake_seconds(1e-3, timed))
    assert wide.measure(_model(bits=None)) is None
    assert timed == []


def test_measure_times_the_real_projections_on_this_machine() -> None:
    assert wide.measure(_model()) in (None, *wide.WIDTHS)


def test_the_mode_is_checked() -> None:
    assert wide.parse_mode("auto") == "auto"
    assert wide.parse_mode("off") == "off"
    assert wide.parse_mode("96") == 96
    for bad in ("0", "-3", "wide"):
        with pytest.raises(ValueError, match="auto, off or a positive row count"):
            wide.parse_mode(bad)
    with pytest.raises(ValueError, match="auto, off or a positive row count"):
        wide.set_mode(0)


@pytest.mark.parametrize("batched", [False, True])
def test_decoders_read_wide_prompts_dequantized_with_the_same_replies(
    batched: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = [syn.prompt("tiny", repeats=r) for r in (9, 12)]
    assert min(len(p) for p in prompts) > 64
    params = GenerationParams(drafting=DraftSetting.of(4), max_tokens=24)
    off, at_64 = EngineOptions(wide="off"), EngineOptions(wide=64)
    target = _model()
    plain = replace(params, drafting=DraftSetting.of(0))
    want = [
        take_turns([Decoder(target, options=off).generate(p, plain)], 24).replies[0]
        for p in prompts
    ]

    seen = _dequantizes(monkeypatch)
    target, draft = _model(), _model(miss=0.2, seed=1)
    if batched:
        batch = Decoder(target, draft, options=at_64)
        got = take_turns([batch.generate(p, params) for p in prompts], 24).replies
    else:
        got = [
            take_turns([Decoder(target, draft, options=at_64).generate(p, params)], 24).replies[0]
            for p in prompts
        ]
    assert got == want
    assert seen  # the prompts' reads ran on dequantized weights
    assert {p.wide for p in _projections(target) + _projections(draft)} == {64}
