"""GGUF import of Qwen3-Next (llama.cpp's qwen3next): Gated DeltaNet layers among attention
and a mixture of experts, written as llama.cpp's converter writes them, now and before it
split in_proj_qkvz."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

from app.engine.loader import config_model, load_model
from app.errors import ModelError
from app.hub.gguf_import import import_gguf
from app.testing.tiny import train_tokenizer
from tests.engine.families import hybrid_config
from tests.fakes import (
    NORMS_STORED_AS_W,
    TokenizerMeta,
    finish_gguf,
    qwen3_next_edits,
    qwen3_next_parameters,
    text_model_writer,
    tiny_tokenizer,
)

_TOKENS = mx.array([[9, 4, 120, 33, 201, 8, 77]])


@dataclass(frozen=True)
class Tiny:
    model: Any  # mlx-lm's qwen3_next Model
    split: Path  # in_proj_qkvz as attn_qkv and attn_gate, as llama.cpp writes it now
    whole: Path  # in_proj_qkvz as ssm_in, as older llama.cpp wrote it
    tensors: dict[str, np.ndarray]  # the GGUF tensors of split
    tokenizer: TokenizerMeta


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    root = tmp_path_factory.mktemp("qwen3next")
    train_tokenizer(root)
    # 4 layers, attention every 2nd, more value heads than key heads, 4 experts, 2 a token;
    # llama.cpp always normalizes the chosen experts' weights, as Qwen3-Next's config asks.
    mx.random.seed(5)
    model = config_model({**hybrid_config("qwen3_next"), "norm_topk_prob": True})
    # Peaked logits, and norms and 1-D parameters off their defaults so that a wrong shift
    # or order shows.
    model.update(
        tree_map(
            lambda p: p + 0.1 * mx.random.normal(p.shape) if p.ndim == 1 else p * 4.0,
            model.parameters(),
        )
    )
    mx.eval(model.parameters())
    weights = hugging_face(model)
    tensors = llama_cpp_tensors(weights, model.args, split=True)
    tokenizer = tiny_tokenizer(root)
    return Tiny(
        model,
        write_qwen3_next(root / "split.gguf", model.args, tensors, tokenizer),
        write_qwen3_next(
            root / "whole.gguf",
            model.args,
            llama_cpp_tensors(weights, model.args, split=False),
            tokenizer,
        ),
        tensors,
        tokenizer,
    )


def hugging_face(model: Any) -> dict[str, np.ndarray]:
    """The weights as a Hugging Face checkpoint holds them (mlx-lm's sanitize undone):
    convolutions as (channels, 1, kernel), norms as w, and the experts stacked as
    Qwen2MoeModel.modify_tensors stacks the checkpoint's one tensor per expert."""
    weights = {}
    for name, value in dict(tree_flatten(model.parameters())).items():
        x = np.array(value)
        if name.endswith(".conv1d.weight"):
            x = np.moveaxis(x, 2, 1)
        if name.endswith(NORMS_STORED_AS_W):
            x = x - 1.0
        weights[name.replace(".switch_mlp.", ".experts.")] = x
    return weights


def llama_cpp_tensors(
    weights: dict[str, np.ndarray], args: Any, *, split: bool
) -> dict[str, np.ndarray]:
    """The tensors convert_hf_to_gguf.py's Qwen3NextModel writes; with ``split`` false,
    in_proj_qkvz left whole, as it was before the converter split it."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3NEXT, args.num_hidden_layers)
    tensors: dict[str, np.ndarray] = {}
    for hf_name, x in weights.items():
        name, x = qwen3_next_edits(hf_name, x)
        if split and name.endswith(".in_proj_qkvz.weight"):
            tensors |= qkvz_split(name, x, args)
            continue
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert mapped is not None, name
        tensors[mapped] = np.ascontiguousarray(x, dtype=np.float32)
    return tensors


def qkvz_split(name: str, x: np.ndarray, args: Any) -> dict[str, np.ndarray]:
    """Qwen3NextModel.modify_tensors: in_proj_qkvz's rows, grouped by key head ([q, k, v, z]
    each), become attn_qkv (all q, all k, all v) and attn_gate (all z)."""
    bid = int(name.split(".")[2])
    k_dim = args.linear_key_head_dim
    v_dim = args.linear_num_value_heads // args.linear_num_key_heads * args.linear_value_head_dim
    heads = x.reshape(args.linear_num_key_heads, -1, x.shape[1])
    q, k, v, z = np.split(heads, [k_dim, 2 * k_dim, 2 * k_dim + v_dim], axis=1)
    qkv = np.concatenate([t.reshape(-1, x.shape[1]) for t in (q, k, v)])
    return {
        f"{gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ATTN_QKV].format(bid=bid)}.weight": qkv,
        f"{gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ATTN_GATE].format(bid=bid)}.weight": (
            np.ascontiguousarray(z.reshape(-1, x.shape[1]))
        ),
    }


def write_qwen3_next(
    path: Path, args: Any, tensors: dict[str, np.ndarray], tokenizer: TokenizerMeta
) -> Path:
    """The metadata of TextModel, Qwen2MoeModel and Qwen3NextModel's set_gguf_parameters."""
    w = text_model_writer(path, "qwen3next", args, args.num_hidden_layers)
    w.add_expert_count(args.num_experts)
    w.add_expert_used_count(args.num_experts_per_tok)
    w.add_expert_feed_forward_length(args.moe_intermediate_size)
    w.add_expert_shared_feed_forward_length(args.shared_expert_intermediate_size)
    qwen3_next_parameters(w, args)
    tokenizer(w)
    w.add_tokenizer_pre("qwen2")  # what llama.cpp names Qwen3-Next's pre-tokenizer
    finish_gguf(w, tensors)
    return path


@pytest.mark.parametrize("layout", ["split", "whole"])
def test_qwen3_next_imports_with_the_same_logits(tiny: Tiny, tmp_path: Path, layout: str) -> None:
    out = import_gguf(getattr(tiny, layout), tmp_path / "qwen3next")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3_next"
    assert (config["num_hidden_layers"], config["full_attention_interval"]) == (4, 2)
    assert (config["linear_num_key_heads"], config["linear_num_value_heads"]) == (2, 4)
    assert (config["num_experts"], config["num_experts_per_tok"]) == (4, 2)
    assert config["norm_topk_prob"] is True
    assert config["partial_rotary_factor"] == 0.25
    loaded = load_model(out)
    np.testing.assert_allclose(
        np.array(loaded.model(_TOKENS)), np.array(tiny.model(_TOKENS)), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (
            {"blk.4.nextn.eh_proj.weight": np.ones((64, 128), dtype=np.float32)},
            "Qwen3-Next MTP layers (nextn tensors) are not supported",
        ),
        ({"blk.0.attn_gate.weight": None}, "the tensors do not make a qwen3_next model"),
    ],
)
def test_an_odd_qwen3_next_file_is_refused_in_one_line(
    tiny: Tiny, tmp_path: Path, change: dict[str, np.ndarray | None], error: str
) -> None:
    tensors = {**tiny.tensors, **change}
    _refused(tiny, tmp_path, tensors, error)


def test_an_attn_qkv_and_gate_split_unlike_the_config_is_refused(
    tiny: Tiny, tmp_path: Path
) -> None:
    # Their rows add up to in_proj_qkvz's, so the model's own check would pass them.
    qkv, gate = tiny.tensors["blk.0.attn_qkv.weight"], tiny.tensors["blk.0.attn_gate.weight"]
    both = np.concatenate([qkv, gate])
    cut = len(qkv) - 16
    moved = {"blk.0.attn_qkv.weight": both[:cut], "blk.0.attn_gate.weight": both[cut:]}
    error = "attn_qkv and attn_gate hold"
    _refused(tiny, tmp_path, {**tiny.tensors, **moved}, error)


def _refused(tiny: Tiny, tmp_path: Path, tensors: dict[str, np.ndarray | None], error: str) -> None:
    kept = {k: v for k, v in tensors.items() if v is not None}
    path = write_qwen3_next(tmp_path / "odd.gguf", tiny.model.args, kept, tiny.tokenizer)
    with pytest.raises(ModelError, match=re.escape(error)) as info:
        import_gguf(path, tmp_path / "odd")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "odd").exists()
