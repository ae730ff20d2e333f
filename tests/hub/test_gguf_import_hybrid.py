"""GGUF import of Qwen3.5 / 3.6 (llama.cpp's qwen35 and qwen35moe): Gated DeltaNet layers
among attention, with and without the MTP layer, written as llama.cpp's converter writes them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map
from tokenizers import Tokenizer

from app.engine import mtp
from app.engine.loader import config_model, load_model, read_header
from app.errors import ModelError
from app.hub.gguf_import import import_folder, import_gguf, model_and_head
from app.testing.tiny import train_tokenizer
from tests.engine.families import hybrid_config
from tests.fakes import (
    NORMS_STORED_AS_W,
    TokenizerMeta,
    _tandem_in_here,
    assert_same_model_and_head,
    finish_gguf,
    head_logits,
    qwen3_next_edits,
    qwen3_next_parameters,
    tiny_tokenizer,
    weights_of,
)

_TOKENS = mx.array([[5, 17, 42, 99, 7, 250, 3]])

# Tandem's MTP head stores its input norms as w too.
_STORED_AS_W = (
    *NORMS_STORED_AS_W,
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
    "mtp.norm.weight",
)

# _Qwen35MtpMixin.filter_tensors' remapper: the head's own tensors, under block n_layer.
_MTP_REMAP = {
    "fc": "eh_proj",
    "pre_fc_norm_embedding": "enorm",
    "pre_fc_norm_hidden": "hnorm",
    "norm": "shared_head.norm",
}

# The installed gguf package predates llama.cpp's listing of these under qwen35
# (gguf-py/gguf/constants.py, MODEL_TENSORS[MODEL_ARCH.QWEN35]); their names are these.
_NEXTN = {
    "eh_proj": gguf.MODEL_TENSOR.NEXTN_EH_PROJ,
    "enorm": gguf.MODEL_TENSOR.NEXTN_ENORM,
    "hnorm": gguf.MODEL_TENSOR.NEXTN_HNORM,
    "shared_head.norm": gguf.MODEL_TENSOR.NEXTN_SHARED_HEAD_NORM,
}


@dataclass(frozen=True)
class Tiny:
    arch: str  # llama.cpp's name
    model: Any  # mlx-lm's qwen3_5 or qwen3_5_moe Model
    head: mtp.MTPHead
    plain: Path  # the GGUF file without the MTP layer
    with_head: Path  # the GGUF file with it
    tensors: dict[str, np.ndarray]  # the GGUF tensors of with_head
    tokenizer: TokenizerMeta


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    arch = request.param
    root = tmp_path_factory.mktemp(arch)
    train_tokenizer(root)
    # 4 layers, more value heads than key heads; the mixture has 4 experts, 2 a token.
    config = hybrid_config({"qwen35": "qwen3_5", "qwen35moe": "qwen3_5_moe"}[arch])
    mx.random.seed(3)
    model = config_model(config)
    head = mtp.MTPHead(model)
    for module in (model, head):
        # Peaked logits, and norms and 1-D parameters off their defaults so that a
        # wrong shift or order shows.
        module.update(
            tree_map(
                lambda p: p + 0.1 * mx.random.normal(p.shape) if p.ndim == 1 else p * 4.0,
                module.parameters(),
            )
        )
    mx.eval(model.parameters(), head.parameters())
    args = model.language_model.args
    tensors = llama_cpp_tensors(hugging_face(model, head), args, arch)
    tokenizer = tiny_tokenizer(root)
    mtp_block = f"blk.{args.num_hidden_layers}."
    plain = {k: v for k, v in tensors.items() if not k.startswith(mtp_block)}
    return Tiny(
        arch,
        model,
        head,
        write_qwen35(root / "plain.gguf", arch, args, plain, tokenizer, mtp_layers=0),
        write_qwen35(root / "head.gguf", arch, args, tensors, tokenizer, mtp_layers=1),
        tensors,
        tokenizer,
    )


def hugging_face(model: Any, head: mtp.MTPHead) -> dict[str, np.ndarray]:
    """The weights as a Hugging Face checkpoint holds them (mlx-lm's sanitize undone):
    convolutions as (channels, 1, kernel), norms as w, experts stacked with gate and up
    in one tensor, the MTP head under ``mtp.``."""
    params = dict(tree_flatten(model.language_model.parameters()))
    params |= {f"mtp.{k}": v for k, v in dict(tree_flatten(head.parameters())).items()}
    weights = {}
    for name, value in params.items():
        x = np.array(value)
        if name.endswith(".conv1d.weight"):
            x = np.moveaxis(x, 1, 2)
        if name.endswith(_STORED_AS_W):
            x = x - 1.0
        weights[name] = x
    for gate in [k for k in weights if k.endswith(".switch_mlp.gate_proj.weight")]:
        mlp = gate.removesuffix(".switch_mlp.gate_proj.weight")
        up = weights.pop(f"{mlp}.switch_mlp.up_proj.weight")
        weights[f"{mlp}.experts.gate_up_proj"] = np.concatenate([weights.pop(gate), up], axis=-2)
        weights[f"{mlp}.experts.down_proj"] = weights.pop(f"{mlp}.switch_mlp.down_proj.weight")
    return weights


def llama_cpp_tensors(
    weights: dict[str, np.ndarray], args: Any, arch: str
) -> dict[str, np.ndarray]:
    """The tensors convert_hf_to_gguf.py's Qwen3_5TextModel (Qwen3_5MoeTextModel) writes."""
    n_layer = args.num_hidden_layers
    names = gguf.get_tensor_name_map(
        {"qwen35": gguf.MODEL_ARCH.QWEN35, "qwen35moe": gguf.MODEL_ARCH.QWEN35MOE}[arch],
        n_layer + 1,
    )
    tensors = {}
    for hf_name, x in weights.items():
        name = mtp_renamed(hf_name, n_layer)
        x = v_heads_reordered(name, x, args)
        name, x = qwen3_next_edits(name, x)
        for part, y in experts_split(name, x):
            tensors[gguf_name(part, names)] = np.ascontiguousarray(y, dtype=np.float32)
    return tensors


def mtp_renamed(name: str, n_layer: int) -> str:
    """_Qwen35MtpMixin.filter_tensors: MTP layer i becomes layer n_layer + i, and the
    head's own tensors join layer n_layer."""
    if not name.startswith("mtp."):
        return name
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[1] == "layers" and parts[2].isdecimal():
        return f"model.layers.{n_layer + int(parts[2])}.{parts[3]}"
    return f"model.layers.{n_layer}.{_MTP_REMAP[parts[1]]}.{parts[2]}"


def reorder_v_heads(x: np.ndarray, dim: int, k_heads: int, per_k: int, size: int) -> np.ndarray:
    """_LinearAttentionVReorderBase._reorder_v_heads, in numpy."""
    shape = list(x.shape)
    split = [*shape[:dim], k_heads, per_k, size, *shape[dim + 1 :]]
    return np.swapaxes(x.reshape(split), dim, dim + 1).reshape(shape)


def v_heads_reordered(name: str, x: np.ndarray, args: Any) -> np.ndarray:
    """_LinearAttentionVReorderBase.modify_tensors: value heads from grouped by key head
    to tiled, where there are more value heads than key heads."""
    k_heads, v_heads = args.linear_num_key_heads, args.linear_num_value_heads
    if k_heads == v_heads or "linear_attn." not in name:
        return x
    per_k, v_dim = v_heads // k_heads, args.linear_value_head_dim
    qk = 2 * args.linear_key_head_dim * k_heads
    if ".in_proj_qkv." in name:
        return np.concatenate([x[:qk], reorder_v_heads(x[qk:], 0, k_heads, per_k, v_dim)])
    if ".in_proj_z." in name:
        return reorder_v_heads(x, 0, k_heads, per_k, v_dim)
    if ".in_proj_b." in name or ".in_proj_a." in name:
        return reorder_v_heads(x, 0, k_heads, per_k, 1)
    if ".A_log" in name or ".dt_bias" in name:
        return reorder_v_heads(x[:, None], 0, k_heads, per_k, 1)[:, 0]
    if ".conv1d" in name:
        x = x.squeeze()
        return np.concatenate([x[:qk], reorder_v_heads(x[qk:], 0, k_heads, per_k, v_dim)])
    if ".out_proj." in name:
        return reorder_v_heads(x, 1, k_heads, per_k, v_dim)
    return x


def experts_split(name: str, x: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """Qwen2MoeModel.modify_tensors: stacked experts named as weights, gate_up split in two."""
    if name.endswith("mlp.experts.down_proj"):
        return [(f"{name}.weight", x)]
    if name.endswith("mlp.experts.gate_up_proj"):
        n_ff, mlp = x.shape[-2] // 2, name.removesuffix(".gate_up_proj")
        return [
            (f"{mlp}.gate_proj.weight", x[..., :n_ff, :]),
            (f"{mlp}.up_proj.weight", x[..., n_ff:, :]),
        ]
    return [(name, x)]


def gguf_name(name: str, names: gguf.TensorNameMap) -> str:
    """TextModel.map_tensor_name."""
    m = re.fullmatch(r"model\.layers\.(\d+)\.(eh_proj|enorm|hnorm|shared_head\.norm)\.weight", name)
    if m:
        return gguf.TENSOR_NAMES[_NEXTN[m.group(2)]].format(bid=int(m.group(1))) + ".weight"
    mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
    assert mapped is not None, name
    return mapped


def write_qwen35(
    path: Path,
    arch: str,
    args: Any,
    tensors: dict[str, np.ndarray],
    tokenizer: TokenizerMeta,
    *,
    mtp_layers: int,
) -> Path:
    """The metadata of TextModel, Qwen2MoeModel, Qwen3NextModel, _Qwen35MRopeMixin and
    _Qwen35MtpMixin's set_gguf_parameters."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(args.num_hidden_layers + mtp_layers)
    w.add_context_length(args.max_position_embeddings)
    w.add_embedding_length(args.hidden_size)
    if args.num_experts:
        # Qwen2MoeModel's sizes; feed_forward_length (the config's intermediate_size) is
        # left out, as a mixture's config may leave it out.
        w.add_expert_count(args.num_experts)
        w.add_expert_used_count(args.num_experts_per_tok)
        w.add_expert_feed_forward_length(args.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(args.shared_expert_intermediate_size)
    else:
        w.add_feed_forward_length(args.intermediate_size)
    w.add_head_count(args.num_attention_heads)
    w.add_head_count_kv(args.num_key_value_heads)
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_rope_freq_base(args.rope_theta)
    w.add_layer_norm_rms_eps(args.rms_norm_eps)
    w.add_key_length(args.head_dim)
    w.add_value_length(args.head_dim)
    qwen3_next_parameters(w, args)
    if mtp_layers:
        w.add_nextn_predict_layers(mtp_layers)
    tokenizer(w)
    w.add_tokenizer_pre("qwen35")  # what llama.cpp names Qwen3.5's pre-tokenizer
    finish_gguf(w, tensors)
    return path


def test_qwen35_imports_with_the_same_logits(tiny: Tiny, tmp_path: Path) -> None:
    out = import_gguf(tiny.plain, tmp_path / "qwen35")
    config = json.loads((out / "config.json").read_text())
    text = config["text_config"]
    assert config["model_type"] == tiny.model.model_type
    assert text["model_type"] == f"{tiny.model.model_type}_text"
    assert text["num_hidden_layers"] == 4
    assert text.get("num_experts", 0) == tiny.model.language_model.args.num_experts
    assert text["full_attention_interval"] == 2
    assert (text["linear_num_key_heads"], text["linear_num_value_heads"]) == (2, 4)
    assert text["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert "mtp_num_hidden_layers" not in text
    assert not mtp.has_head(out)
    loaded = load_model(out, fuse=False)
    np.testing.assert_allclose(
        np.array(loaded.model(_TOKENS)), np.array(tiny.model(_TOKENS)), rtol=1e-5, atol=1e-5
    )
    # Qwen3.5's pre-tokenizer keeps a combining mark with its letter; GPT-2's splits it off.
    split = Tokenizer.from_file(str(out / "tokenizer.json")).pre_tokenizer
    assert len(split.pre_tokenize_str("cafe\u0301 au lait")) == 3


def test_qwen35_keeps_a_log_in_float32(tiny: Tiny, tmp_path: Path) -> None:
    out = import_gguf(tiny.plain, tmp_path / "qwen35", dtype="bfloat16")
    dtypes = {k: t.dtype for k, t in read_header(out / "model.safetensors").items()}
    assert {d for k, d in dtypes.items() if k.endswith(".A_log")} == {"F32"}
    assert dtypes["model.layers.0.linear_attn.dt_bias"] == "BF16"
    assert load_model(out).config["model_type"] == tiny.model.model_type


def test_qwen35_mtp_layer_imports_as_the_targets_head(tiny: Tiny, tmp_path: Path) -> None:
    out = import_gguf(tiny.with_head, tmp_path / "qwen35")
    config = json.loads((out / "config.json").read_text())
    assert config["text_config"]["num_hidden_layers"] == 4
    assert config["text_config"]["mtp_num_hidden_layers"] == 1
    assert mtp.has_head(out)
    loaded = load_model(out, fuse=False)
    assert_same_model_and_head(loaded, out, tiny.model, tiny.head, _TOKENS)


def test_qwen35_quantized_keeps_its_mtp_head(tiny: Tiny, tmp_path: Path) -> None:
    out = import_gguf(tiny.with_head, tmp_path / "qwen35", q_bits=8)
    assert mtp.has_head(out)
    loaded = load_model(out)
    head = mtp.load_head(out, loaded.model, loaded.config)
    assert isinstance(head.fc, nn.QuantizedLinear)
    # The original head, beside the same quantized target: only the head's rounding differs.
    got = np.array(head_logits(loaded.model, head, _TOKENS))
    want = np.array(head_logits(loaded.model, tiny.head, _TOKENS))
    assert np.linalg.norm(got - want) < 0.03 * np.linalg.norm(want)


def test_a_float_folder_quantizes_with_its_mtp_head_as_its_gguf_does(
    tiny: Tiny, tmp_path: Path
) -> None:
    # The float import is the model in Hugging Face's layout, its head's norms stored as w.
    float_folder = import_gguf(tiny.with_head, tmp_path / "float")
    out = import_folder(float_folder, tmp_path / "models", q_bits=8)
    assert mtp.has_head(out)
    want = weights_of(import_gguf(tiny.with_head, tmp_path / "q8", q_bits=8))
    got = weights_of(out)
    assert got.keys() == want.keys()
    assert any(k.startswith("mtp.") and k.endswith(".scales") for k in got)
    for key, value in got.items():
        np.testing.assert_array_equal(value, want[key], err_msg=key)


def mtp_only(tiny: Tiny, path: Path) -> Path:
    """The head as llama.cpp's ``--mtp`` writes it apart: its block, with the model's
    embeddings, final norm and output (``_Qwen35MtpMixin.filter_tensors``)."""
    args = tiny.model.language_model.args
    repeated = ("token_embd.weight", "output_norm.weight", "output.weight")
    kept = {
        k: v
        for k, v in tiny.tensors.items()
        if k.startswith(f"blk.{args.num_hidden_layers}.") or k in repeated
    }
    return write_qwen35(path, tiny.arch, args, kept, tiny.tokenizer, mtp_layers=1)


def test_a_head_written_apart_imports_with_its_model(tiny: Tiny, tmp_path: Path) -> None:
    head = mtp_only(tiny, tmp_path / "mtp-tiny.gguf")
    joined = import_gguf(tiny.plain, tmp_path / "joined", mtp=head)
    whole = import_gguf(tiny.with_head, tmp_path / "whole")
    config = json.loads((joined / "config.json").read_text())
    assert config == json.loads((whole / "config.json").read_text())
    assert config["text_config"]["mtp_num_hidden_layers"] == 1
    got, want = weights_of(joined), weights_of(whole)
    assert got.keys() == want.keys()
    for key, value in got.items():
        np.testing.assert_array_equal(value, want[key], err_msg=key)
    # Two files chosen together, in either order: the model's comes first.
    assert (
        model_and_head(head, tiny.plain)
        == model_and_head(tiny.plain, head)
        == (
            tiny.plain,
            head,
        )
    )


def test_models_import_takes_the_heads_file_along(tiny: Tiny, tmp_path: Path) -> None:
    head = mtp_only(tiny, tmp_path / "mtp-tiny.gguf")
    r = _tandem_in_here(tmp_path, "models", "import", str(tiny.plain), "--mtp", str(head))
    assert r.returncode == 0, r.stderr
    assert mtp.has_head(Path(r.stdout.strip()))
    folder = _tandem_in_here(tmp_path, "models", "import", str(tmp_path), "--mtp", str(head))
    assert folder.returncode == 2
    assert folder.stderr == "tandem: --mtp: a folder carries its MTP head itself\n"


def test_a_head_alone_or_with_the_wrong_model_is_refused_in_one_line(
    tiny: Tiny, tmp_path: Path
) -> None:
    head = mtp_only(tiny, tmp_path / "mtp-tiny.gguf")
    refusals = [
        (head, None, "mtp-tiny.gguf holds only an MTP head (llama.cpp's --mtp): import it "
         "with its model's file"),
        (tiny.with_head, head, "head.gguf carries its MTP layers already: import it alone"),
        (tiny.plain, tiny.plain, "plain.gguf is no MTP head alone (llama.cpp's --mtp writes "
         "those)"),
    ]  # fmt: skip
    for model, mtp_file, message in refusals:
        out = tmp_path / "out"
        with pytest.raises(ModelError) as caught:
            import_gguf(model, out, mtp=mtp_file)
        assert str(caught.value) == message
        assert not out.exists() and not list(tmp_path.glob(".out.*"))


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("blk.0.ssm_d", "tensor 'blk.0.ssm_d' has no MLX counterpart"),
        ("blk.4.nextn.embed_tokens.weight", "has no MLX counterpart"),
        ("blk.4.ssm_out.weight", "the tensors do not make a qwen3_5"),
    ],
)
def test_an_unknown_hybrid_tensor_is_refused_in_one_line(
    tiny: Tiny, tmp_path: Path, name: str, error: str
) -> None:
    args = tiny.model.language_model.args
    tensors = {**tiny.tensors, name: np.ones((64, 16), dtype=np.float32)}
    path = write_qwen35(
        tmp_path / "odd.gguf", tiny.arch, args, tensors, tiny.tokenizer, mtp_layers=1
    )
    with pytest.raises(ModelError, match=re.escape(error)) as info:
        import_gguf(path, tmp_path / "odd")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "odd").exists()
