"""GGUF import of Nemotron-H (llama.cpp's nemotron_h, nemotron_h_moe): one mixer a layer,
Mamba2, attention, an MLP or a mixture of experts, written as llama.cpp's converter
(NemotronHModel, through GraniteHybridModel and Mamba2Model) writes them, with its names
from the gguf package's own map."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import gguf
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from app.engine import mtp
from app.engine.loader import config_model, load_model
from app.hub.gguf_import import import_gguf
from tests.conftest import TinyModels
from tests.engine.families import hybrid_config, next_n_config
from tests.fakes import (
    add_mamba2_keys,
    assert_drafts_for_itself,
    assert_same_model_and_head,
    converted,
    finish_gguf,
    imported_as,
    text_model_writer,
    tiny_tokenizer,
)

T = gguf.MODEL_TENSOR
_TOKENS = mx.array([[5, 17, 42, 99, 7, 250, 3]])
_EXPERTS = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "moe_shared_expert_intermediate_size": 32, "n_shared_experts": 1, "n_group": 1,
            "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.5}  # fmt: skip


def _model(moe: bool, latent: int | None = None) -> Any:
    config = hybrid_config("nemotron_h")
    config.update(n_groups=2, hybrid_override_pattern="M*ME" if moe else "M*M-")
    if moe:
        config.update(_EXPERTS, moe_latent_size=latent)
    mx.random.seed(9)
    model = config_model(config)
    mx.eval(model.parameters())
    return model


# What NemotronHModel renames of its MTP head before mapping it, as one block past the layers.
_MTP_RENAMES = {
    "mtp.layers.0.enorm.weight": gguf.TENSOR_NAMES[T.NEXTN_ENORM] + ".weight",
    "mtp.layers.0.hnorm.weight": gguf.TENSOR_NAMES[T.NEXTN_HNORM] + ".weight",
    "mtp.layers.0.eh_proj.weight": gguf.TENSOR_NAMES[T.NEXTN_EH_PROJ] + ".weight",
    "mtp.layers.1.norm.weight": gguf.TENSOR_NAMES[T.FFN_NORM] + ".weight",
    "mtp.layers.1.final_layernorm.weight": gguf.TENSOR_NAMES[T.NEXTN_SHARED_HEAD_NORM] + ".weight",
}


def write_nemotron(
    path: Path, model: Any, tokenizer: Path, head: dict[str, mx.array] | None = None
) -> Path:
    """The metadata of TextModel, GraniteHybridModel and NemotronHModel.set_gguf_parameters
    (one width and key-value head count a layer, 0 where it has none) and the tensors as
    their modify_tensors writes them; ``head`` (stored names): its MTP head folded into one
    block past the layers, counted in the lists as attention and experts."""
    args = model.args
    pattern = list(args.hybrid_override_pattern) + (["*E"] if head else [])
    moe = "E" in "".join(pattern)
    layers = args.num_hidden_layers
    kv = [args.num_key_value_heads if "*" in c else 0 for c in pattern]
    arch = gguf.MODEL_ARCH.NEMOTRON_H_MOE if moe else gguf.MODEL_ARCH.NEMOTRON_H
    w = text_model_writer(path, gguf.MODEL_ARCH_NAMES[arch], args, len(pattern), kv)
    widths = {"-": args.intermediate_size, "E": args.moe_intermediate_size, "*E":
              args.moe_intermediate_size}  # fmt: skip
    w.add_feed_forward_length([widths.get(c, 0) for c in pattern])  # overwrites TextModel's
    a = args
    add_mamba2_keys(w, a.conv_kernel, a.ssm_state_size, a.n_groups, a.mamba_num_heads,
                    a.mamba_head_dim)  # fmt: skip
    w.add_rope_scaling_finetuned(False)
    if moe:
        w.add_expert_used_count(args.num_experts_per_tok)
        w.add_expert_feed_forward_length(args.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(args.moe_shared_expert_intermediate_size)
        w.add_expert_count(args.n_routed_experts)
        w.add_expert_shared_count(args.n_shared_experts)
        w.add_expert_weights_norm(args.norm_topk_prob)
        w.add_expert_weights_scale(args.routed_scaling_factor)
        w.add_expert_group_count(args.n_group)
        if args.moe_latent_size is not None:
            w.add_moe_latent_size(args.moe_latent_size)
    if head:
        w.add_nextn_predict_layers(1)
    tiny_tokenizer(tokenizer)(w)
    names = gguf.get_tensor_name_map(arch, len(pattern))

    def add(name: str, value: mx.array) -> None:
        x = np.array(value, dtype=np.float32)
        if ".mixer." in name:
            x = converted(name.rsplit(".mixer.", 1)[1], x, args)
        # The converter's names: Mamba2Model's dt_proj.bias, the experts stacked.
        name = name.replace(".mixer.dt_bias", ".mixer.dt_proj.bias")
        name = name.replace(".e_score_correction_bias", ".e_score_correction.bias")
        if ".switch_mlp." in name:
            layer = name.split(".")[2]
            kind = "up_proj" if ".fc1." in name else "down_proj"
            name = f"model.layers.{layer}.mlp.experts.{kind}.weight"
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert mapped is not None, name
        tensors[mapped] = x

    tensors: dict[str, np.ndarray] = {}
    for name, value in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters())):
        add(name, value)
    for name, value in (head or {}).items():
        if name in _MTP_RENAMES:
            tensors[_MTP_RENAMES[name].format(bid=layers)] = np.array(value, dtype=np.float32)
        else:  # its blocks' own tensors, as the model's block ``layers``'s
            add(f"backbone.layers.{layers}." + name.split(".", 3)[3], value)
    finish_gguf(w, tensors)
    return path


@pytest.mark.parametrize(
    ("moe", "latent"), [(False, None), (True, None), (True, 16)], ids=["dense", "experts", "latent"]
)
def test_nemotron_h_imports_with_the_same_logits(
    moe: bool, latent: int | None, tiny: TinyModels, tmp_path: Path
) -> None:
    model = _model(moe, latent)
    path = write_nemotron(tmp_path / "n.gguf", model, tiny.target)
    config = imported_as(path, tmp_path / "n", model)
    assert config["model_type"] == "nemotron_h"
    assert config["hybrid_override_pattern"] == list(model.args.hybrid_override_pattern)
    assert (config["n_groups"], config.get("moe_latent_size")) == (2, latent)


def test_an_imported_nemotron_h_drafts_for_itself(tiny: TinyModels, tmp_path: Path) -> None:
    path = write_nemotron(tmp_path / "n.gguf", _model(True), tiny.target)
    assert_drafts_for_itself(import_gguf(path, tmp_path / "n"))


def test_nemotron_h_imports_its_folded_mtp_block_as_the_targets_head(
    tiny: TinyModels, tmp_path: Path
) -> None:
    # Its MTP head: an attention block, then experts; its own MLP layer experts too, as
    # Nemotron-H's with experts have them (llama.cpp tells the two kinds apart by the file).
    config = {**next_n_config("nemotron_h"), "hybrid_override_pattern": "M*ME"}
    mx.random.seed(4)
    target = config_model(config)
    head = mtp.head_of(target, config)
    mx.eval(target.parameters(), head.parameters())
    params = cast(list[tuple[str, mx.array]], tree_flatten(head.parameters()))
    stored = {mtp.stored_name(k, config): v for k, v in params}
    path = write_nemotron(tmp_path / "n.gguf", target, tiny.target, stored)
    out = import_gguf(path, tmp_path / "n")
    loaded = load_model(out, fuse=False)
    assert loaded.config["num_nextn_predict_layers"] == 1
    assert loaded.config["hybrid_override_pattern"] == list(target.args.hybrid_override_pattern)
    assert_same_model_and_head(loaded, out, target, head, _TOKENS)


def test_mamba2_alone_imports_with_the_same_logits(tiny: TinyModels, tmp_path: Path) -> None:
    """A model of Mamba2 layers alone (llama.cpp's mamba2, Mamba-Codestral's): no attention
    in its metadata (a head count of 0), its layers filed as Nemotron-H's Mamba2 ones."""
    config = {**hybrid_config("mamba2"), "n_groups": 2}
    mx.random.seed(6)
    model = config_model(config)
    mx.eval(model.parameters())
    args = model.args
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "mamba2")
    w.add_context_length(2**20)
    w.add_embedding_length(args.hidden_size)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(args.num_hidden_layers)
    add_mamba2_keys(w, args.conv_kernel, args.state_size, args.n_groups, args.num_heads,
                    args.head_dim)  # fmt: skip
    w.add_layer_norm_rms_eps(args.layer_norm_epsilon)
    tiny_tokenizer(tiny.target)(w)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MAMBA2, args.num_hidden_layers)
    tensors = {}
    for name, value in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters())):
        x = np.array(value, dtype=np.float32)
        if ".mixer." in name:
            x = converted(name.rsplit(".mixer.", 1)[1], x, args)
        name = name.replace(".mixer.dt_bias", ".mixer.dt_proj.bias")  # Mamba2Model's
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert mapped is not None, name
        tensors[mapped] = x
    finish_gguf(w, tensors)
    config = imported_as(tmp_path / "m.gguf", tmp_path / "m", model)
    assert (config["model_type"], config["n_groups"]) == ("mamba2", 2)
