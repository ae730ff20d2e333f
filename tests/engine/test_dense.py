"""A quantized draft kept dequantized: when, what it computes, and that replies stay exact."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
import pytest

from app.engine import dense, fuse
from app.engine.batch import BatchDecoder, take_turns
from app.engine.speculative import Decoder
from app.engine.types import GenerationParams
from app.testing import synthetic as syn

PLENTY = 1 << 40  # bytes of device memory: room for any tiny model


@pytest.fixture(autouse=True)
def _auto_after() -> Iterator[None]:
    yield
    dense.set_mode("auto")


def _model(miss: float = 0.0, seed: int = 0, fused: bool = True, shape: str = "tiny") -> nn.Module:
    model = syn.build(shape, miss=miss, seed=seed, bits=4, dtype=mx.float32)
    if fused:
        fuse.fuse(model)
    return model


def _quantized(model: nn.Module) -> list[str]:
    return [
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding)
        or (isinstance(m, fuse.FusedProjection) and m.quantized)
    ]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("shape", ["tiny", "tiny-llama"])
def test_on_dequantizes_every_quantized_weight_and_computes_the_same(
    fused: bool, shape: str
) -> None:
    model = _model(fused=fused, shape=shape)
    tokens = mx.array([syn.prompt(shape)[:24]])
    want = model(tokens)
    assert _quantized(model)
    dense.set_mode("on")

    choice = dense.install(model)

    assert choice.dense and choice.reason == "on"
    assert choice.extra > 0
    assert _quantized(model) == []
    got = model(tokens)
    assert mx.allclose(got, want, atol=1e-4).item()


def test_off_and_unknown_memory_keep_the_weights_quantized() -> None:
    dense.set_mode("off")
    off = _model()
    assert dense.install(off, memory=PLENTY) == dense.Choice(False, reason="off")
    dense.set_mode("auto")
    unknown, small = _model(), _model()
    assert not dense.install(unknown, memory=0).dense
    tight = dense.install(small, memory=1 << 20)  # the dequantized weights need more
    assert not tight.dense and tight.extra > dense.SHARE * (1 << 20)
    assert tight.reason == "the dequantized weights would not fit"
    assert all(_quantized(m) for m in (off, unknown, small))


def test_auto_times_both_ways_and_keeps_the_faster_by_a_margin() -> None:
    model = _model()
    choice = dense.install(model, memory=PLENTY)
    assert choice.quantized > 0 and choice.dequantized > 0
    faster = choice.dequantized <= (1 - dense.MIN_GAIN) * choice.quantized
    assert choice.dense == faster
    assert bool(_quantized(model)) != faster


def test_install_chooses_once_per_model() -> None:
    dense.set_mode("on")
    model = _model()
    first = dense.install(model)
    dense.set_mode("off")
    assert dense.install(model) is first
    assert _quantized(model) == []
    plain = syn.build("tiny", dtype=mx.float32)
    assert dense.install(plain) == dense.Choice(False, reason="no quantized weights")


def test_the_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="auto, on or off"):
        dense.set_mode("sometimes")


@pytest.mark.parametrize("batched", [False, True])
def test_decoders_dequantize_the_draft_only_and_reply_as_the_target_alone(batched: bool) -> None:
    prompts = [syn.prompt("tiny", repeats=r) for r in (2, 3)]
    params = GenerationParams(num_draft=4, max_tokens=24)
    target = _model()
    want = [
        take_turns([Decoder(target).generate(p, replace(params, num_draft=0))], 24).replies[0]
        for p in prompts
    ]

    dense.set_mode("on")
    draft = _model(miss=0.2, seed=1)
    if batched:
        batch = BatchDecoder(target, draft)
        got = take_turns([batch.generate(p, params) for p in prompts], 24).replies
    else:
        got = [
            take_turns([Decoder(target, draft).generate(p, params)], 24).replies[0] for p in prompts
        ]

    assert got == want
    assert _quantized(draft) == []
    assert _quantized(target)  # the target stays as loaded
