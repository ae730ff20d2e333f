"""GGUF import of Falcon-H1 (llama.cpp's falcon-h1): attention and Mamba2 side by side in
every layer, then an MLP, written as llama.cpp's converter (Mamba2Model, FalconH1Model)
writes them, its multipliers folded into the weights, with the gguf package's names."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import gguf
import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from app.engine.loader import config_model
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
    "pre_ff_layernorm.weight": (T.FFN_NORM, "weight"),
    **MAMBA2_AND_ATTENTION,
    "feed_forward.gate_proj.weight": (T.FFN_GATE, "weight"),
    "feed_forward.up_proj.weight": (T.FFN_UP, "weight"),
    "feed_forward.down_proj.weight": (T.FFN_DOWN, "weight"),
}
_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.final_layernorm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def _falcon_h1() -> Any:
    """A tiny Falcon-H1 with its gated norm in two groups; mlx-lm's model holds the
    weights with the multipliers folded in, as llama.cpp's file does."""
    mx.random.seed(6)
    model = config_model(
        {**hybrid_config("falcon_h1"), "mamba_rms_norm": True, "mamba_n_groups": 2}
    )
    mx.eval(model.parameters())
    return model


def _write(path: Path, model: Any, tokenizer: Path) -> Path:
    args = model.args
    layers = args.num_hidden_layers
    w = text_model_writer(path, "falcon-h1", args, layers)
    add_mamba2_keys(w, args.mamba_d_conv, args.mamba_d_state, args.mamba_n_groups,
                    args.mamba_n_heads, args.mamba_d_head)  # fmt: skip
    tiny_tokenizer(tokenizer, pre="falcon-h1")(w)
    tensors = {}
    for name, value in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters())):
        x = np.array(value, dtype=np.float32)
        if name in _TOP:
            tensors[_TOP[name]] = x
            continue
        _, _, bid, own = name.split(".", 3)
        if own.startswith("mamba."):  # rope rotates halves here: Q/K rows stay as they are
            x = converted(own.split(".", 1)[1], x, args)
        tensor, suffix = _LAYER[own]
        tensors[block_tensor_name(tensor, int(bid), suffix)] = x
    finish_gguf(w, tensors)
    return path


def test_falcon_h1_imports_with_the_same_logits_and_drafts_for_itself(
    tiny: TinyModels, tmp_path: Path
) -> None:
    model = _falcon_h1()
    out = tmp_path / "out"
    config = imported_as(_write(tmp_path / "falcon.gguf", model, tiny.target), out, model)
    assert config["model_type"] == "falcon_h1"
    assert config["mamba_d_ssm"] == model.args.mamba_d_ssm
    assert config["embedding_multiplier"] == 1.0  # folded into the weights by llama.cpp
    assert_drafts_for_itself(out)
