"""GGUF import of LFM2 and LFM2-MoE (llama.cpp's lfm2, lfm2moe): short convolutions among
attention layers, written as llama.cpp's converter (LFM2Model, LFM2MoeModel) writes them,
with its names from the gguf package's own map."""

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
from tests.conftest import TinyModels
from tests.engine.families import hybrid_config
from tests.fakes import (
    assert_drafts_for_itself,
    finish_gguf,
    imported_as,
    text_model_writer,
    tiny_tokenizer,
)

_ARCHS = {"lfm2": gguf.MODEL_ARCH.LFM2, "lfm2_moe": gguf.MODEL_ARCH.LFM2MOE}


def _model(family: str) -> Any:
    mx.random.seed(5)
    model = config_model(hybrid_config(family))
    mx.eval(model.parameters())
    return model


def write_lfm2(path: Path, family: str, model: Any, tokenizer: Path) -> Path:
    """The metadata of TextModel and LFM2Model (or LFM2MoeModel).set_gguf_parameters, and
    the tensors as their modify_tensors writes them: the convolution 2-D, experts stacked,
    the routing bias renamed."""
    args = model.args
    layers = args.num_hidden_layers
    # One a layer, 0 for a convolution.
    kv = [args.num_key_value_heads if i in args.full_attn_idxs else 0 for i in range(layers)]
    # LFM2's feed-forward width is its adjusted block_ff_dim: intermediate_size in this config.
    assert family != "lfm2" or args.block_ff_dim == args.intermediate_size
    w = text_model_writer(path, gguf.MODEL_ARCH_NAMES[_ARCHS[family]], args, layers, kv)
    w.add_vocab_size(args.vocab_size)
    w.add_shortconv_l_cache(args.conv_L_cache)
    if family == "lfm2_moe":
        w.add_expert_count(args.num_experts)
        w.add_expert_used_count(args.num_experts_per_tok)
        w.add_expert_feed_forward_length(args.moe_intermediate_size)
        w.add_leading_dense_block_count(args.num_dense_layers)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    tiny_tokenizer(tokenizer, pre="lfm2", add_bos=None)(w)
    names = gguf.get_tensor_name_map(_ARCHS[family], layers)
    tensors = {}
    for name, value in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters())):
        x = np.array(value, dtype=np.float32)
        if name.endswith("conv.conv.weight"):  # MLX's (C, L, 1): the checkpoint's (C, 1, L)
            x = x.transpose(0, 2, 1).squeeze(1)
        name = name.replace(".switch_mlp.", ".experts.")
        if name.endswith(".expert_bias"):
            name += ".bias"
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert mapped is not None, name
        tensors[mapped] = x
    finish_gguf(w, tensors)
    return path


@pytest.mark.parametrize("family", ["lfm2", "lfm2_moe"])
def test_lfm2_imports_with_the_same_logits(family: str, tiny: TinyModels, tmp_path: Path) -> None:
    model = _model(family)
    path = write_lfm2(tmp_path / f"{family}.gguf", family, model, tiny.target)
    config = imported_as(path, out := tmp_path / family, model)
    assert config["model_type"] == family
    assert config["full_attn_idxs"] == list(model.args.full_attn_idxs)
    # llama.cpp reads lfm2 as Llama 3's pre-tokenizer, BOS added without the key.
    split = Tokenizer.from_file(str(out / "tokenizer.json")).pre_tokenizer
    assert [p for p, _ in split.pre_tokenize_str("12345")] == ["123", "45"]
    assert json.loads((out / "tokenizer_config.json").read_text())["add_bos_token"] is True


def test_lfm2_quantized_loads_and_drafts_for_itself(tiny: TinyModels, tmp_path: Path) -> None:
    path = write_lfm2(tmp_path / "lfm2.gguf", "lfm2", _model("lfm2"), tiny.target)
    out = import_gguf(path, tmp_path / "lfm2", q_bits=8)
    assert json.loads((out / "config.json").read_text())["quantization"]["bits"] == 8
    assert_drafts_for_itself(out)  # its convolutions' states go back: drafts are verified
