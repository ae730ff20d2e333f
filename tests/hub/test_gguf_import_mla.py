"""GGUF import of llama.cpp's deepseek2 files: DeepSeek-V3's multi-head latent attention and
GLM-4.7-Flash's (its next-n layer with it), written as DeepseekV2Model writes them: the
latent as one KV head, kv_b_proj split in two, names from the gguf package's own map."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import gguf
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from tokenizers import Tokenizer
from tokenizers.pre_tokenizers import ByteLevel

from app.engine import mtp
from app.engine.loader import config_model, load_model
from app.errors import ModelError
from app.hub.gguf_import import import_gguf
from tests.conftest import TinyModels
from tests.engine.families import next_n_config
from tests.fakes import (
    add_routing,
    assert_same_model_and_head,
    finish_converted,
    finish_gguf,
    kv_b_whole,
    text_model_writer,
    tiny_tokenizer,
)

_TOKENS = mx.array([[5, 17, 42, 99, 7, 250, 3]])
# DeepSeek-V3's long-context rope, as its config.json has it.
_YARN = {
    "type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 1024,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}


def _flat(module: nn.Module) -> dict[str, mx.array]:
    return dict(cast(list[tuple[str, mx.array]], tree_flatten(module.parameters())))


def _model(config: dict[str, Any]) -> Any:
    mx.random.seed(4)
    model = config_model(config)
    mx.eval(model.parameters())
    return model


@pytest.fixture(scope="module")
def flash() -> tuple[Any, mtp.MTPHead]:
    """A tiny GLM-4.7-Flash and its next-n head."""
    target = _model(next_n_config("glm4_moe_lite"))
    head = mtp.MTPHead(target)
    mx.eval(head.parameters())
    return target, head


def _deepseek_v3() -> Any:
    """A tiny DeepSeek-V3 of two layers (its files carry no next-n layer), with q_lora and yarn."""
    config = next_n_config("deepseek_v3")
    return _model({**config, "num_hidden_layers": 2, "first_k_dense_replace": 1,
                   "rope_scaling": _YARN, "num_nextn_predict_layers": 0})  # fmt: skip


def write_deepseek2(
    path: Path,
    target: Any,
    head: mtp.MTPHead | None,
    tokenizer: Path,
    pre: str,
    *,
    older: bool = False,
) -> Path:
    """The metadata of TextModel and DeepseekV2Model.set_gguf_parameters (with the next-n
    layer as Glm4MoeLiteModel writes it); ``older``: as files before key_length_mla and
    the split of kv_b_proj."""
    args = target.args
    layers = args.num_hidden_layers
    config = {"model_type": target.model_type, "num_hidden_layers": layers}
    tensors = _flat(target)
    if older:
        tensors = kv_b_whole(tensors, args.kv_lora_rank)
    if head is not None:
        tensors |= {mtp.stored_name(k, config): v for k, v in _flat(head).items()}
    blocks = layers + (1 if head is not None else 0)
    w = text_model_writer(path, "deepseek2", args, blocks)
    w.add_head_count_kv(1)  # the latent: one KV head
    add_routing(w, args)
    w.add_vocab_size(args.vocab_size)
    if args.q_lora_rank is not None:
        w.add_q_lora_rank(args.q_lora_rank)
    w.add_kv_lora_rank(args.kv_lora_rank)
    if older:
        w.add_key_length(args.qk_nope_head_dim + args.qk_rope_head_dim)
        w.add_value_length(args.v_head_dim)
    else:
        w.add_key_length(args.kv_lora_rank + args.qk_rope_head_dim)
        w.add_value_length(args.kv_lora_rank)
        w.add_key_length_mla(args.qk_nope_head_dim + args.qk_rope_head_dim)
        w.add_value_length_mla(args.v_head_dim)
    w.add_rope_dimension_count(args.qk_rope_head_dim)
    if args.rope_scaling:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(args.rope_scaling["factor"])
        w.add_rope_scaling_orig_ctx_len(args.rope_scaling["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_log_mul(0.1 * args.rope_scaling["mscale_all_dim"])
    finish_converted(w, gguf.MODEL_ARCH.DEEPSEEK2, layers, tensors, tiny_tokenizer(tokenizer), pre)
    return path


def test_glm_flash_imports_with_the_same_logits_and_its_next_n_layer_as_its_head(
    flash: tuple[Any, mtp.MTPHead], tiny: TinyModels, tmp_path: Path
) -> None:
    target, head = flash
    path = write_deepseek2(tmp_path / "flash.gguf", target, head, tiny.target, "glm4")
    out = import_gguf(path, tmp_path / "flash")
    loaded = load_model(out, fuse=False)
    config = loaded.config
    assert config["model_type"] == "glm4_moe_lite" and config["num_nextn_predict_layers"] == 1
    assert (config["qk_nope_head_dim"], config["v_head_dim"], config["q_lora_rank"]) == (
        16,
        16,
        None,
    )
    assert_same_model_and_head(loaded, out, target, head, _TOKENS)


@pytest.mark.parametrize("older", [False, True], ids=["split", "kv_b-whole"])
def test_deepseek_v3_imports_with_its_latent_attention_and_yarn_rope(
    tiny: TinyModels, tmp_path: Path, older: bool
) -> None:
    target = _deepseek_v3()
    path = write_deepseek2(
        tmp_path / "v3.gguf", target, None, tiny.target, "deepseek-v3", older=older
    )
    out = import_gguf(path, tmp_path / "v3")
    loaded = load_model(out, fuse=False)
    assert loaded.config["model_type"] == "deepseek_v3"
    assert loaded.config["rope_scaling"]["mscale_all_dim"] == pytest.approx(1.0)
    # Past the original context, where yarn's rope differs from plain rope.
    tokens = mx.array([[(7 * i) % 300 for i in range(1100)]])
    np.testing.assert_allclose(
        np.array(loaded.model(tokens)[:, -4:]),
        np.array(target(tokens)[:, -4:]),
        rtol=1e-4,
        atol=1e-4,
    )


def test_deepseek_v2s_softmax_routing_is_refused(tiny: TinyModels, tmp_path: Path) -> None:
    path = write_deepseek2(tmp_path / "v2.gguf", _deepseek_v3(), None, tiny.target, "deepseek-llm")
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(str(tmp_path / "softmax.gguf"), "deepseek2")
    for field in reader.fields.values():
        skip = ("GGUF.", "general.architecture", "deepseek2.expert_gating_func")
        if not field.name.startswith(skip):
            writer.add_key_value(field.name, field.contents(), field.types[0], field.types[-1])
    finish_gguf(writer, {t.name: np.array(t.data) for t in reader.tensors})
    with pytest.raises(ModelError) as caught:
        import_gguf(tmp_path / "softmax.gguf", tmp_path / "v2")
    assert str(caught.value) == (
        "softmax.gguf: DeepSeek-V2's routing is not supported (V3's and GLM's are)"
    )


def test_deepseek_v3s_pre_tokenizer_splits_as_its_tokenizer_json_does(
    tiny: TinyModels, tmp_path: Path
) -> None:
    path = write_deepseek2(tmp_path / "v3.gguf", _deepseek_v3(), None, tiny.target, "deepseek-v3")
    split = Tokenizer.from_file(str(import_gguf(path, tmp_path / "v3") / "tokenizer.json"))
    pieces = [p for p, _ in split.pre_tokenizer.pre_tokenize_str("12345\u4e2d\u6587abc, hi")]
    # Digits three at a time, Chinese apart, then the rest (as bytes: a space is \u0120).
    chinese = ByteLevel(add_prefix_space=False).pre_tokenize_str("\u4e2d\u6587")[0][0]
    assert pieces == ["123", "45", chinese, "abc", ",", "\u0120hi"]
