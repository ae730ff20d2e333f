"""GGUF import of GLM-4.5 / 4.6 / 4.7 (llama.cpp's glm4moe): a dense layer, then mixtures of
experts, and the next-n layer past them as the target's MTP head, written as llama.cpp's
converter (Glm4MoeModel) writes them, with its names from the gguf package's own map."""

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

from app.engine import mtp
from app.engine.loader import config_model, load_model, read_header
from app.errors import ModelError
from app.hub.gguf_import import import_gguf
from tests.conftest import TinyModels
from tests.engine.families import next_n_config
from tests.fakes import (
    add_routing,
    assert_same_model_and_head,
    finish_converted,
    finish_gguf,
    head_logits,
    text_model_writer,
    tiny_tokenizer,
)

_TOKENS = mx.array([[5, 17, 42, 99, 7, 250, 3]])


def _flat(module: nn.Module) -> dict[str, mx.array]:
    return dict(cast(list[tuple[str, mx.array]], tree_flatten(module.parameters())))


@pytest.fixture(scope="module")
def glm() -> tuple[Any, mtp.MTPHead]:
    """A tiny GLM-4.5 (two layers, the second a mixture of experts) and its next-n head."""
    mx.random.seed(3)
    target = config_model(next_n_config("glm4_moe"))
    head = mtp.MTPHead(target)
    mx.eval(target.parameters(), head.parameters())
    return target, head


def write_glm(path: Path, target: Any, head: mtp.MTPHead | None, tokenizer: Path) -> Path:
    """The metadata of TextModel and Glm4MoeModel.set_gguf_parameters; the head (if any) as
    block n_layer, as convert_hf_to_gguf.py writes it unless --no-mtp, with the embedding
    and output it repeats."""
    args = target.args
    config = next_n_config("glm4_moe")
    layers = args.num_hidden_layers
    tensors = _flat(target)
    if head is not None:
        tensors |= {mtp.stored_name(k, config): v for k, v in _flat(head).items()}
        tensors[f"model.layers.{layers}.embed_tokens.weight"] = target.model.embed_tokens.weight
        tensors[f"model.layers.{layers}.shared_head.head.weight"] = target.lm_head.weight
    blocks = layers + (1 if head is not None else 0)
    w = text_model_writer(path, "glm4moe", args, blocks)
    w.add_rope_dimension_count(int(args.head_dim * args.partial_rotary_factor))
    add_routing(w, args)
    # glm4: what llama.cpp names GLM-4.5's pre-tokenizer
    finish_converted(
        w, gguf.MODEL_ARCH.GLM4_MOE, layers, tensors, tiny_tokenizer(tokenizer), "glm4"
    )
    return path


def test_glm_imports_with_the_same_logits_and_its_next_n_layer_as_its_head(
    glm: tuple[Any, mtp.MTPHead], tiny: TinyModels, tmp_path: Path
) -> None:
    target, head = glm
    path = write_glm(tmp_path / "glm.gguf", target, head, tiny.target)
    out = import_gguf(path, tmp_path / "glm")
    loaded = load_model(out, fuse=False)
    config = loaded.config
    assert config["model_type"] == "glm4_moe" and config["num_hidden_layers"] == 2
    assert config["num_nextn_predict_layers"] == 1
    assert (config["partial_rotary_factor"], config["use_qk_norm"]) == (0.5, True)
    # What the next-n layer repeats of the model is left out.
    stored = read_header(out / "model.safetensors")
    assert "model.layers.2.eh_proj.weight" in stored
    assert "model.layers.2.embed_tokens.weight" not in stored
    assert_same_model_and_head(loaded, out, target, head, _TOKENS)
    # GLM's pre-tokenizer (Llama 3's regex) reads digits three at a time; GPT-2's whole.
    split = Tokenizer.from_file(str(out / "tokenizer.json")).pre_tokenizer
    assert [p for p, _ in split.pre_tokenize_str("12345")] == ["123", "45"]


def test_glm_without_its_next_n_layer_imports_without_a_head(
    glm: tuple[Any, mtp.MTPHead], tiny: TinyModels, tmp_path: Path
) -> None:
    target, _ = glm
    out = import_gguf(write_glm(tmp_path / "glm.gguf", target, None, tiny.target), tmp_path / "g")
    assert "num_nextn_predict_layers" not in load_model(out).config
    assert not mtp.has_head(out)


def test_glm_quantized_keeps_its_next_n_layer(
    glm: tuple[Any, mtp.MTPHead], tiny: TinyModels, tmp_path: Path
) -> None:
    target, head = glm
    path = write_glm(tmp_path / "glm.gguf", target, head, tiny.target)
    out = import_gguf(path, tmp_path / "glm", q_bits=8)
    loaded = load_model(out)  # strict: the layer is where mlx-lm's sanitize drops it
    imported = mtp.load_head(out, loaded.model, loaded.config)
    assert isinstance(imported.fc, nn.QuantizedLinear)
    got = np.array(head_logits(loaded.model, imported, _TOKENS))
    want = np.array(head_logits(loaded.model, head, _TOKENS))
    assert np.linalg.norm(got - want) < 0.03 * np.linalg.norm(want)


def test_a_glm_head_written_apart_imports_with_its_model(
    glm: tuple[Any, mtp.MTPHead], tiny: TinyModels, tmp_path: Path
) -> None:
    target, head = glm
    whole = import_gguf(write_glm(tmp_path / "w.gguf", target, head, tiny.target), tmp_path / "w")
    # llama.cpp's --no-mtp and --mtp: the model alone, and the head with what it repeats.
    model = write_glm(tmp_path / "model.gguf", target, None, tiny.target)
    both = write_glm(tmp_path / "both.gguf", target, head, tiny.target)
    reader = gguf.GGUFReader(both)
    kept = {"token_embd.weight", "output_norm.weight", "output.weight"}
    head_only = tmp_path / "mtp-model.gguf"
    writer = gguf.GGUFWriter(str(head_only), "glm4moe")
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            writer.add_key_value(field.name, field.contents(), field.types[0], field.types[-1])
    own = {
        t.name: np.array(t.data)
        for t in reader.tensors
        if t.name.startswith("blk.2.") or t.name in kept
    }
    finish_gguf(writer, own)
    out = import_gguf(model, tmp_path / "apart", mtp=head_only)
    assert mtp.has_head(out)
    apart = mtp.head_weights(out, load_model(out).config, load_model(out, fuse=False).model)
    together = mtp.head_weights(
        whole, load_model(whole).config, load_model(whole, fuse=False).model
    )
    assert apart.keys() == together.keys()
    for name, value in together.items():
        assert mx.array_equal(apart[name], value), name


def test_a_glm_model_file_given_as_its_head_is_refused(
    glm: tuple[Any, mtp.MTPHead], tiny: TinyModels, tmp_path: Path
) -> None:
    target, _ = glm
    model = write_glm(tmp_path / "model.gguf", target, None, tiny.target)
    with pytest.raises(ModelError) as caught:
        import_gguf(model, tmp_path / "x", mtp=model)
    assert str(caught.value) == "model.gguf is no MTP head alone (llama.cpp's --mtp writes those)"
