"""GGUF import of Qwen3's mixtures of experts (llama.cpp's qwen3moe: Qwen3-30B-A3B,
Qwen3-Coder), written as convert_hf_to_gguf.py's Qwen3MoeModel writes them, with the
gguf package's own names."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import gguf
import mlx.core as mx
from mlx.utils import tree_flatten

from app.engine.loader import config_model
from app.testing.tiny import model_config
from tests.conftest import TinyModels
from tests.fakes import finish_converted, imported_as, text_model_writer, tiny_tokenizer


def _qwen3_moe() -> Any:
    config = {
        **model_config("qwen3_moe", num_attention_heads=4, num_key_value_heads=2),
        "head_dim": 16,
        "rope_theta": 1_000_000.0,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
    }
    mx.random.seed(4)
    model = config_model(config)
    mx.eval(model.parameters())
    return model


def _write(path: Path, model: Any, tokenizer: Path) -> Path:
    """The metadata of TextModel and Qwen2MoeModel.set_gguf_parameters (no shared expert)."""
    args = model.args
    w = text_model_writer(path, "qwen3moe", args, args.num_hidden_layers)
    w.add_expert_count(args.num_experts)
    w.add_expert_used_count(args.num_experts_per_tok)
    w.add_expert_feed_forward_length(args.moe_intermediate_size)
    tensors = dict(cast(list[tuple[str, mx.array]], tree_flatten(model.parameters())))
    arch = gguf.MODEL_ARCH.QWEN3MOE
    finish_converted(w, arch, args.num_hidden_layers, tensors, tiny_tokenizer(tokenizer), "qwen2")
    return path


def test_qwen3_moe_imports_with_the_same_logits(tiny: TinyModels, tmp_path: Path) -> None:
    model = _qwen3_moe()
    config = imported_as(
        _write(tmp_path / "q3moe.gguf", model, tiny.target), tmp_path / "out", model
    )
    assert config["model_type"] == "qwen3_moe"
    assert (config["num_experts"], config["num_experts_per_tok"]) == (4, 2)
    assert "shared_expert_intermediate_size" not in config
