"""Fused projections: same logits, fewer nodes, weights once in the tree."""

from __future__ import annotations

import re
from pathlib import Path
from typing import cast

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import llama, qwen2, qwen3
from mlx_lm.models.cache import make_prompt_cache

from app.engine import fuse

ARCHS = {"llama": llama, "qwen2": qwen2, "qwen3": qwen3}


def _leaves(model: nn.Module) -> list[tuple[str, mx.array]]:
    return cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))


def _model(arch: str, quantized: bool) -> nn.Module:
    mx.random.seed(0)
    module = ARCHS[arch]
    args = module.ModelArgs.from_dict(
        dict(
            model_type=arch,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
            vocab_size=300,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
            tie_word_embeddings=False,
            max_position_embeddings=512,
        )
    )
    model = module.Model(args)
    if quantized:
        nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def _run(model: nn.Module) -> list[mx.array]:
    cache = make_prompt_cache(model)
    out = [model(mx.array([[1, 2, 3, 4, 5]]), cache=cache)]
    out += [model(mx.array([[t]]), cache=cache) for t in (7, 9)]
    return out


def _matmuls(model: nn.Module, tmp_path: Path) -> int:
    """Matmul nodes in the graph of one decoding step."""
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([[1, 2]]), cache=cache))
    dot = tmp_path / "step.dot"
    mx.export_to_dot(str(dot), model(mx.array([[3]]), cache=cache))
    return len(re.findall(r'label ="(?:Matmul|AddMM)"', dot.read_text()))


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("quantized", [False, True])
def test_fused_model_computes_the_same_logits(arch: str, quantized: bool) -> None:
    model = _model(arch, quantized)
    before = _run(model)
    params = sum(v.size for _, v in _leaves(model))

    assert fuse.fuse(model) == 2 * len(model.layers)  # q/k/v and gate/up in each layer
    after = _run(model)

    for a, b in zip(before, after, strict=True):
        assert mx.allclose(a, b, atol=1e-5).item()
    # The fused weights appear once in the tree, the separate ones are gone.
    assert sum(v.size for _, v in _leaves(model)) == params
    names = [k for k, _ in _leaves(model)]
    assert not any(".q_proj." in n or ".gate_proj." in n for n in names)


def test_fuse_is_idempotent_and_leaves_no_arrays_behind() -> None:
    model = _model("qwen2", quantized=False)
    fuse.fuse(model)
    assert fuse.fuse(model) == 0
    _run(model)
    for _, module in model.named_modules():
        if isinstance(module, fuse.FusedProjection):
            memo = object.__getattribute__(module, "_memo")
            assert memo.x is None and memo.parts == []


def test_fusing_cuts_the_matmuls_of_a_step(tmp_path: Path) -> None:
    model = _model("qwen2", quantized=False)
    layers = len(model.layers)
    before = _matmuls(model, tmp_path)
    fuse.fuse(model)
    # q, k, v become one matmul and gate, up another: three fewer per layer.
    assert before - _matmuls(model, tmp_path) == 3 * layers


def test_a_part_called_on_another_input_gets_its_own_result() -> None:
    layers = [nn.Linear(8, n, bias=True) for n in (4, 2, 2)]
    mx.eval([layer.parameters() for layer in layers])
    proj = fuse.FusedProjection(layers)
    parts = [fuse.Part(proj, i) for i in range(3)]
    x, y = mx.random.normal((1, 3, 8)), mx.random.normal((1, 3, 8))
    assert mx.allclose(parts[0](x), layers[0](x), atol=1e-6).item()
    assert mx.allclose(parts[1](y), layers[1](y), atol=1e-6).item()  # not x's result
    assert mx.allclose(parts[2](y), layers[2](y), atol=1e-6).item()


def test_projections_of_different_kinds_are_left_alone() -> None:
    model = _model("llama", quantized=False)
    attn = model.layers[0].self_attn
    nn.quantize(attn, group_size=32, bits=4, class_predicate=lambda p, m: p == "q_proj")
    assert fuse.fuse(model) == 2 * len(model.layers) - 1
    assert isinstance(attn.q_proj, nn.QuantizedLinear)


def test_load_model_fuses_unless_asked_not_to(tiny) -> None:
    from app.engine.loader import load_model

    fused = load_model(tiny.target).model
    plain = load_model(tiny.target, fuse=False).model
    assert isinstance(fused.layers[0].self_attn.q_proj, fuse.Part)
    assert isinstance(plain.layers[0].self_attn.q_proj, nn.Linear)
    x = mx.array([[1, 2, 3]])
    assert mx.allclose(fused(x), plain(x), atol=1e-5).item()
