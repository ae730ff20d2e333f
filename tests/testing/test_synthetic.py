"""Synthetic model shapes, configs and (quantized) builds."""

from __future__ import annotations

from typing import cast

import mlx.core as mx
import mlx.nn as nn
import pytest

from app.testing import synthetic as syn


def _greedy(model: nn.Module, shape: str) -> list[int]:
    cycle = mx.array(syn.prompt(shape, repeats=1))[None]
    return cast(list[int], mx.argmax(model(cycle)[0], axis=-1).tolist())


def test_config_of_70b_without_building() -> None:
    cfg = syn.config("70b")
    assert cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 80
    assert cfg["hidden_size"] == 8192
    assert cfg["num_attention_heads"] == 64
    assert cfg["num_key_value_heads"] == 8
    assert cfg["head_dim"] == 128
    assert cfg["intermediate_size"] == 28672
    assert cfg["vocab_size"] == 128256
    assert cfg["rope_theta"] == 500000.0
    assert cfg["tie_word_embeddings"] is False


def test_config_of_32b_is_qwen2() -> None:
    cfg = syn.config("32b", vocab_size=1000)
    assert cfg["model_type"] == "qwen2"
    assert "head_dim" not in cfg
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (64, 5120, 1000)


@pytest.mark.parametrize("shape", list(syn.SHAPES))
def test_every_config_reads_as_its_family_args(shape: str) -> None:
    from mlx_lm.models import llama, qwen2, qwen3_5

    cfg = syn.config(shape)
    family = {"llama": llama, "qwen2": qwen2, "qwen3_5": qwen3_5}[cfg["model_type"]]
    args = family.ModelArgs.from_dict(cfg)
    if cfg["model_type"] == "qwen3_5":  # its text model's arguments
        args = qwen3_5.TextModelArgs.from_dict(args.text_config)
        assert args.full_attention_interval == syn.SHAPES[shape].full_every
    assert args.num_hidden_layers == syn.SHAPES[shape].layers
    assert args.tie_word_embeddings is False


def test_a_hybrid_pair_continues_the_cycle_and_misses_where_set() -> None:
    length = syn.cycle_length("tiny-hybrid")
    prompt = syn.prompt("tiny-hybrid")
    for miss in (0.0, 0.25):
        model = syn.build("tiny-hybrid", miss=miss, seed=1, bits=4)
        nexts = cast(list[int], mx.argmax(model(mx.array([prompt]))[0], axis=-1).tolist())
        want = [syn.CYCLE_START + (t - syn.CYCLE_START + 1) % length for t in prompt]
        assert sum(n != w for n, w in zip(nexts, want, strict=True)) == 2 * round(miss * length)


def test_parse_pair_and_describe() -> None:
    assert syn.parse_pair("70b:1b") == ("70b", "1b")
    assert syn.describe("70b") == "llama 80 layers, hidden 8192"
    assert syn.describe("7b") == "qwen2 28 layers, hidden 3584"
    with pytest.raises(ValueError, match="unknown shape 'huge'") as err:
        syn.parse_pair("70b:huge")
    assert all(name in str(err.value) for name in syn.SHAPES)


@pytest.mark.parametrize("bits", [None, 4, 8])
@pytest.mark.parametrize("shape", ["tiny", "tiny-llama"])
def test_cycle_and_acceptance_survive_quantization(shape: str, bits: int | None) -> None:
    want = [syn.CYCLE_START + (i + 1) % 64 for i in range(64)]
    target = syn.build(shape, bits=bits)
    assert _greedy(target, shape) == want
    draft = syn.build(shape, miss=0.5, seed=1, bits=bits)
    got = _greedy(draft, shape)
    assert sum(g != w for g, w in zip(got, want, strict=True)) == 32


@pytest.mark.parametrize("shape", ["tiny", "tiny-llama"])
def test_quantized_build_has_no_full_precision_linear(shape: str) -> None:
    model = syn.build(shape, bits=4, dtype=mx.bfloat16)
    kinds = [type(m) for _, m in model.named_modules()]
    assert nn.Linear not in kinds and nn.Embedding not in kinds
    assert kinds.count(nn.QuantizedLinear) == 7 * 2 + 1
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    assert model.lm_head.bits == 4 and model.lm_head.group_size == 64
    assert model.model.norm.weight.dtype == mx.bfloat16
    assert model.lm_head.scales.dtype == mx.bfloat16


def test_full_precision_build_keeps_dtype() -> None:
    model = syn.build("tiny-llama", dtype=mx.float16)
    assert isinstance(model.lm_head, nn.Linear)
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == mx.float16


def test_build_rejects_bad_quantization() -> None:
    with pytest.raises(ValueError, match="bits must be None, 4 or 8"):
        syn.build("tiny", bits=3)
    with pytest.raises(ValueError, match=r"hidden size 64.* must be multiples of 128"):
        syn.build("tiny", bits=4, group_size=128)


def test_build_rejects_shapes_that_do_not_quantize(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(syn.SHAPES, "odd", syn.Shape("qwen2", 1, 64, 4, 2, 96, 128))
    with pytest.raises(ValueError, match=r"shape 'odd'.*intermediate size 96"):
        syn.build("odd", bits=8)


def test_quantized_build_peaks_below_full_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    # Big enough that one layer is small next to the whole model in float32.
    shape = syn.Shape("llama", 8, 256, 4, 2, 1024, 1024)
    monkeypatch.setitem(syn.SHAPES, "mid", shape)
    per_layer = 4 * (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 1024)
    full = shape.layers * per_layer + 4 * 2 * 1024 * 256
    mx.clear_cache()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    model = syn.build("mid", bits=4)
    assert mx.get_peak_memory() - base < full / 2
    assert _greedy(model, "mid") == [syn.CYCLE_START + (i + 1) % 64 for i in range(64)]


def _head_acceptance(miss: float, k: int) -> list[float]:
    """Per depth, the share of a synthetic head's drafts the target accepted, greedy."""
    from app.engine.decoder import Decoder, take_turns
    from app.engine.types import DraftSetting, GenerationParams

    target = syn.build("tiny-hybrid-wide", bits=4)
    head = syn.build_head(target, "tiny-hybrid-wide", miss=miss, bits=4)
    params = GenerationParams(temperature=0, drafting=DraftSetting.of(k))
    gen = Decoder(target, head).generate(syn.prompt("tiny-hybrid-wide"), params)
    turns = take_turns([gen], 160)
    reached = [0] * k
    kept = [0] * k
    for r in turns.rounds[0]:
        for depth in range(r.k):
            reached[depth] += depth <= r.accepted  # drafts after a rejected one are never judged
            kept[depth] += depth < r.accepted
    return [a / max(1, n) for a, n in zip(kept, reached, strict=True)]


def test_a_synthetic_mtp_head_misses_where_set_and_more_with_depth() -> None:
    assert syn.parse_pair("qwen3.6-27b:mtp") == ("qwen3.6-27b", "mtp")
    assert _head_acceptance(0.0, 3) == [1.0, 1.0, 1.0]  # every draft right
    first, second, third = _head_acceptance(0.25, 3)
    assert 0.6 < first < 0.9  # about 3 in 4 right at depth 1
    assert second < first - 0.1 and third < first - 0.1  # a further quarter missed from depth 2
