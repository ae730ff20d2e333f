"""GGUF import of gpt-oss (llama.cpp's gpt-oss: gpt-oss-20b and -120b), written as
convert_hf_to_gguf.py's GptOssModel writes it: its experts in MXFP4, its sinks named
``.weight``, a yarn rope, and OpenAI's o200k pre-tokenizer ("gpt-4o")."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import gguf
import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from app.engine.loader import config_model
from app.testing.tiny import model_config
from tests.conftest import TinyModels
from tests.fakes import (
    finish_gguf,
    imported_as,
    text_model_writer,
    tiny_tokenizer,
)

_MXFP4 = gguf.GGMLQuantizationType.MXFP4
_EXPERTS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


def _gpt_oss() -> Any:
    config = {
        **model_config("gpt_oss", num_hidden_layers=3, num_attention_heads=4),
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 8,
        "rope_theta": 150_000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
        },
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    }
    mx.random.seed(6)
    model = config_model(config)
    # Sinks start at zero; random ones show that they arrive.
    for layer in model.model.layers:
        layer.self_attn.sinks = mx.random.normal(layer.self_attn.sinks.shape)
    mx.eval(model.parameters())
    return model


def _write(path: Path, model: Any, tokenizer: Path) -> Path:
    """GptOssModel's metadata and tensors. Each expert tensor is MXFP4, as in OpenAI's
    checkpoint; the model takes the values it rounds to, which the import must give."""
    args = model.args
    w = text_model_writer(path, "gpt-oss", args, args.num_hidden_layers)
    w.add_expert_count(args.num_local_experts)
    w.add_expert_used_count(args.num_experts_per_tok)
    w.add_expert_feed_forward_length(args.intermediate_size)
    w.add_sliding_window(args.sliding_window)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(args.rope_scaling["factor"])
    w.add_rope_scaling_orig_ctx_len(args.rope_scaling["original_max_position_embeddings"])
    tiny_tokenizer(tokenizer, pre="gpt-4o")(w)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, args.num_hidden_layers)
    tensors: dict[str, np.ndarray] = {}
    rounded: list[tuple[str, mx.array]] = []
    for name, value in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters())):
        key = name + ".weight" if name.endswith(".sinks") else name  # as llama.cpp names them
        mapped = names.get_name(key, try_suffixes=(".weight", ".bias"))
        assert mapped is not None, name
        x = np.array(value, dtype=np.float32)
        if mapped.endswith(_EXPERTS):
            packed = gguf.quants.quantize(x, _MXFP4)
            w.add_tensor(mapped, packed, raw_shape=packed.shape, raw_dtype=_MXFP4)
            x = gguf.quants.dequantize(packed, _MXFP4)
            rounded.append((name, mx.array(x)))
        else:
            tensors[mapped] = x
    model.load_weights(rounded, strict=False)
    finish_gguf(w, tensors)
    return path


def test_gpt_oss_imports_with_the_same_logits(tiny: TinyModels, tmp_path: Path) -> None:
    model = _gpt_oss()
    config = imported_as(_write(tmp_path / "oss.gguf", model, tiny.target), tmp_path / "out", model)
    assert config["model_type"] == "gpt_oss"
    assert (config["num_local_experts"], config["num_experts_per_tok"]) == (4, 2)
    assert config["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    assert config["rope_scaling"]["rope_type"] == "yarn"


def test_the_o200k_pre_tokenizer_splits_as_its_regex_does(tmp_path: Path, tiny: TinyModels) -> None:
    from tokenizers import Tokenizer

    from app.hub.gguf_import import import_gguf

    out = import_gguf(_write(tmp_path / "oss.gguf", _gpt_oss(), tiny.target), tmp_path / "out")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.pre_tokenizer is not None
    pieces = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("HelloWorld don't 12345\n\nok")]
    # Words split before a capital, the contraction kept, digits three at a time.
    assert pieces == ["Hello", "World", "Ġdon't", "Ġ", "123", "45", "ĊĊ", "ok"]
