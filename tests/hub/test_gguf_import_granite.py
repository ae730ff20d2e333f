"""GGUF import of Granite 4's hybrids (llama.cpp's granitehybrid): Mamba2 layers among
attention, with a mixture of experts and a shared one or a dense MLP, written as llama.cpp's
converter (Mamba2Model, GraniteHybridModel) writes them, with its tensor names from the gguf
package's own constants."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import gguf
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from tokenizers import Tokenizer

from app.engine.loader import config_model
from app.hub.gguf_import import import_gguf
from app.testing.tiny import model_config
from tests.conftest import TinyModels
from tests.engine.families import hybrid_config
from tests.fakes import (
    MAMBA2_AND_ATTENTION,
    add_mamba2_keys,
    assert_drafts_for_itself,
    block_tensor_name,
    converted,
    finish_gguf,
    imported_as,
    text_model_writer,
    tiny_tokenizer,
)

T = gguf.MODEL_TENSOR

# mlx-lm's names within a layer, and llama.cpp's tensor for each.
_LAYER = {
    "input_layernorm.weight": (T.ATTN_NORM, "weight"),
    "post_attention_layernorm.weight": (T.FFN_NORM, "weight"),
    **MAMBA2_AND_ATTENTION,
    "block_sparse_moe.router.layer.weight": (T.FFN_GATE_INP, "weight"),
    "block_sparse_moe.switch_mlp.gate_proj.weight": (T.FFN_GATE_EXP, "weight"),
    "block_sparse_moe.switch_mlp.up_proj.weight": (T.FFN_UP_EXP, "weight"),
    "block_sparse_moe.switch_mlp.down_proj.weight": (T.FFN_DOWN_EXP, "weight"),
    "shared_mlp.output_linear.weight": (T.FFN_DOWN_SHEXP, "weight"),
    "mlp.gate_proj.weight": (T.FFN_GATE, "weight"),
    "mlp.up_proj.weight": (T.FFN_UP, "weight"),
    "mlp.down_proj.weight": (T.FFN_DOWN, "weight"),
}


def _config(moe: bool) -> dict[str, Any]:
    """A tiny Granite 4 hybrid: with experts and no rope (as Granite 4.0-H's), or dense with
    rope (Bamba's kind); multipliers away from 1, two Mamba2 groups."""
    config = hybrid_config("granitemoehybrid")
    config.update(
        embedding_multiplier=2.0,
        attention_multiplier=0.3,
        residual_multiplier=0.5,
        logits_scaling=4.0,
        mamba_n_groups=2,
        position_embedding_type="nope" if moe else "rope",
    )
    if not moe:
        config.update(num_local_experts=0)
    return config


def write_granite(path: Path, model: Any, tokenizer: Path) -> Path:
    """The metadata of TextModel, GraniteMoeModel and GraniteHybridModel.set_gguf_parameters,
    and the tensors as their modify_tensors writes them."""
    args = model.args
    layers = args.num_hidden_layers
    attention = [i for i, kind in enumerate(args.layer_types) if kind == "attention"]
    use_rope = args.position_embedding_type == "rope"
    kv = [args.num_key_value_heads if i in attention else 0 for i in range(layers)]
    w = text_model_writer(path, "granitehybrid", args, layers, kv)
    w.add_attention_scale(args.attention_multiplier)
    w.add_embedding_scale(args.embedding_multiplier)
    w.add_residual_scale(args.residual_multiplier)
    w.add_logit_scale(args.logits_scaling)
    if args.num_local_experts:
        w.add_expert_count(args.num_local_experts)
        w.add_expert_used_count(args.num_experts_per_tok)
        w.add_expert_shared_feed_forward_length(args.shared_intermediate_size)
    a = args
    add_mamba2_keys(w, a.mamba_d_conv, a.mamba_d_state, a.mamba_n_groups, a.mamba_n_heads,
                    a.mamba_d_head)  # fmt: skip
    w.add_rope_scaling_finetuned(use_rope)
    tiny_tokenizer(tokenizer, pre="refact")(w)  # Granite's pre-tokenizer, as llama.cpp names it
    tensors = {}
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}  # fmt: skip
    for name, value in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters())):
        x = np.array(value, dtype=np.float32)
        if name in top:
            tensors[top[name]] = x
            continue
        _, _, bid, own = name.split(".", 3)
        b = int(bid)
        if own == "shared_mlp.input_linear.weight":  # split into gate and up rows
            gate, up = np.split(x, 2)
            tensors[block_tensor_name(T.FFN_GATE_SHEXP, b, "weight")] = gate
            tensors[block_tensor_name(T.FFN_UP_SHEXP, b, "weight")] = up
            continue
        x = converted(own.split(".", 1)[1], x, args)
        tensor, suffix = _LAYER[own]
        tensors[block_tensor_name(tensor, b, suffix)] = x
    finish_gguf(w, tensors)
    return path


@pytest.mark.parametrize("moe", [True, False], ids=["experts-nope", "dense-rope"])
def test_granite_hybrid_imports_with_the_same_logits(
    moe: bool, tiny: TinyModels, tmp_path: Path
) -> None:
    mx.random.seed(7)
    model = config_model(_config(moe))
    mx.eval(model.parameters())
    path = write_granite(tmp_path / "granite.gguf", model, tiny.target)
    config = imported_as(path, tmp_path / "g", model)
    assert config["model_type"] == "granitemoehybrid"
    assert config["layer_types"] == list(model.args.layer_types)
    assert config["position_embedding_type"] == ("nope" if moe else "rope")
    assert (config["embedding_multiplier"], config["logits_scaling"]) == (2.0, 4.0)
    out = tmp_path / "g"
    # refact: llama.cpp's StarCoder group, every digit apart.
    split = Tokenizer.from_file(str(out / "tokenizer.json")).pre_tokenizer
    assert [p for p, _ in split.pre_tokenize_str("123")] == ["1", "2", "3"]
    assert json.loads((out / "config.json").read_text())["mamba_n_groups"] == 2


def test_an_imported_granite_hybrid_drafts_for_itself(tiny: TinyModels, tmp_path: Path) -> None:
    model = config_model(_config(moe=True))
    mx.eval(model.parameters())
    out = import_gguf(write_granite(tmp_path / "granite.gguf", model, tiny.target), tmp_path / "g")
    assert_drafts_for_itself(out)


@pytest.mark.parametrize("family", ["granite", "granitemoe"])
def test_granite_3_imports_with_the_same_logits(
    family: str, tiny: TinyModels, tmp_path: Path
) -> None:
    """Granite 3's dense models and mixtures of experts (llama.cpp's granite, granitemoe:
    llama's blocks, Q/K permuted, the multipliers as scales, the experts' input_linear split
    into gate and up; tied embeddings)."""
    config = {**model_config(family, num_hidden_layers=2), "tie_word_embeddings": True,
              "attention_multiplier": 0.3, "embedding_multiplier": 2.0,
              "residual_multiplier": 0.5, "logits_scaling": 4.0, "attention_bias": False,
              "mlp_bias": False}  # fmt: skip
    if family == "granitemoe":
        config.update(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32)
    mx.random.seed(8)
    model = config_model(config)
    mx.eval(model.parameters())
    args = model.args
    w = text_model_writer(tmp_path / "g3.gguf", family, args, args.num_hidden_layers)
    w.add_attention_scale(args.attention_multiplier)
    w.add_embedding_scale(args.embedding_multiplier)
    w.add_residual_scale(args.residual_multiplier)
    w.add_logit_scale(args.logits_scaling)
    if family == "granitemoe":  # TextModel's
        w.add_expert_count(args.num_local_experts)
        w.add_expert_used_count(args.num_experts_per_tok)
    tiny_tokenizer(tiny.target, pre="refact")(w)
    arch = gguf.MODEL_ARCH.GRANITE_MOE if family == "granitemoe" else gguf.MODEL_ARCH.GRANITE
    names = gguf.get_tensor_name_map(arch, args.num_hidden_layers)
    split = {"gate_proj": T.FFN_GATE_EXP, "up_proj": T.FFN_UP_EXP}  # GraniteMoeModel's
    tensors = {}
    for name, value in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters())):
        own = name.rsplit(".self_attn.", 1)[-1]
        x = converted(own, np.array(value, dtype=np.float32), args)  # Q/K permuted
        expert = name.rsplit(".switch_mlp.", 1)[-1].removesuffix(".weight")
        if expert in split:
            tensors[block_tensor_name(split[expert], int(name.split(".")[2]), "weight")] = x
            continue
        name = name.replace(".switch_mlp.down_proj.", ".output_linear.")
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert mapped is not None, name
        tensors[mapped] = x
    finish_gguf(w, tensors)
    config = imported_as(tmp_path / "g3.gguf", tmp_path / "g3", model)
    assert (config["model_type"], config["residual_multiplier"]) == (family, 0.5)
