"""A next-n layer as the target's MTP head: GLM-4.5 / 4.6 / 4.7's, GLM-4.7-Flash's, GLM-5's,
DeepSeek-V3's and V3.2's, filed past the model's own layers (``model.layers.{n}.*``), their
experts one tensor each and, for MLA attention, ``kv_b_proj`` whole; DeepSeek-V3's in fp8
too; and MiMo's, filed as ``model.mtp_layers.0.*`` and reading the hidden state first,
unnormed; and MiMo-V2-Flash's, the first of three under ``model.mtp.layers``, attending
within its window."""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.switch_layers import QuantizedSwitchLinear

from app.engine.decoder import Decoder, take_turns
from app.engine.loader import config_model, load_model
from app.engine.mtp import (
    NEXT_N,
    MTPDraft,
    MTPHead,
    embed,
    has_head,
    head_of,
    head_problem,
    hidden_and_logits,
    load_head,
    logits,
    stored_name,
)
from app.engine.types import DraftSetting, GenerationParams
from app.hub.gguf_import import import_folder
from tests.conftest import TinyModels
from tests.engine.families import NEXT_N_FAMILIES as FAMILIES
from tests.engine.families import next_n_config
from tests.fakes import as_fp8, kv_b_whole

TOKENS = mx.array([[3, 9, 27, 81, 243, 100, 7, 50]])


def _final_norm(model: Any) -> Any:
    """The model's final norm (Nemotron-H's is its backbone's norm_f)."""
    stack = getattr(model, "model", None) or model.backbone
    return getattr(stack, "norm", None) or stack.norm_f


@functools.cache
def _model(family: str) -> Any:
    """A tiny model of ``family`` whose final norm is far from one, so that using it shows."""
    mx.random.seed(5)
    model = config_model(next_n_config(family))
    norm = _final_norm(model)
    norm.weight = mx.random.uniform(0.2, 3.0, norm.weight.shape)
    mx.eval(model.parameters())
    return model


@pytest.fixture(params=FAMILIES)
def target(request: pytest.FixtureRequest) -> Any:
    return _model(request.param)


def _params(module: nn.Module) -> dict[str, mx.array]:
    return dict(cast(list[tuple[str, mx.array]], tree_flatten(module.parameters())))


def _checkpoint(folder: Path, target: Any, head: dict[str, mx.array], tokenizer: Path) -> Path:
    """A Hugging Face GLM folder: the model's weights, the head as its next-n layer with
    one tensor an expert (and MLA's ``kv_b_proj`` whole), and the embedding and output
    head it repeats."""
    folder.mkdir()
    config = next_n_config(target.model_type)
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer / name, folder / name)
    stored = _params(target)
    for name, value in kv_b_whole(head, config.get("kv_lora_rank")).items():
        key = stored_name(name, config)
        if ".switch_mlp." in key:  # one tensor an expert, as Hugging Face keeps them
            for e in range(value.shape[0]):
                expert = key.replace(".switch_mlp.", f".experts.{e}.")
                # Nemotron-H's, as mlx-lm's sanitize names them back.
                expert = expert.replace(".fc1.", ".up_proj.").replace(".fc2.", ".down_proj.")
                stored[expert] = value[e]
        else:
            stored[key] = value
    if target.model_type in NEXT_N:
        n = config["num_hidden_layers"]
        stored[f"model.layers.{n}.embed_tokens.weight"] = stored["model.embed_tokens.weight"]
        stored[f"model.layers.{n}.shared_head.head.weight"] = stored["lm_head.weight"]
    mx.save_safetensors(str(folder / "model.safetensors"), stored)
    return folder


def _rewrite(
    folder: Path, change: Callable[[dict[str, mx.array]], dict[str, mx.array]]
) -> dict[str, mx.array]:
    """Rewrites a checkpoint's tensors as ``change`` gives them back; those it wrote."""
    stored = change(cast(dict[str, mx.array], mx.load(str(folder / "model.safetensors"))))
    mx.save_safetensors(str(folder / "model.safetensors"), stored)
    return stored


def _random_head(target: Any) -> dict[str, mx.array]:
    mx.random.seed(7)
    head = head_of(target, next_n_config(target.model_type))
    mx.eval(head.parameters())
    return _params(head)


def test_the_next_n_layer_loads_as_the_head_and_the_model_without_it(
    target: Any, tiny: TinyModels, tmp_path: Path
) -> None:
    weights = _random_head(target)
    folder = _checkpoint(tmp_path / "glm", target, weights, tiny.target)
    assert has_head(folder)
    loaded = load_model(folder, fuse=False)  # mlx-lm's own load leaves the layer out
    head = load_head(folder, loaded.model, loaded.config)
    got = _params(head)
    assert got.keys() == weights.keys()
    for name, value in weights.items():
        assert mx.array_equal(got[name], value), name


def _wired(target: Any, swapped: bool = False) -> dict[str, mx.array]:
    """A head that passes the hidden state through as its family wires it (or with fc's
    halves ``swapped``): fc takes the hidden half as it is, the layer adds nothing
    (attention's and every MLP's outputs zero); where the family reads the state before
    the target's final norm, the head's own norm is the target's."""
    head = head_of(target, next_n_config(target.model_type))
    weights = _params(head)
    size = weights["norm.weight"].shape[0]
    eye, zero = mx.eye(size), mx.zeros((size, size))
    hidden_first = head.hidden_first != swapped
    weights["fc.weight"] = mx.concatenate([eye, zero] if hidden_first else [zero, eye], axis=1)
    for name in weights:
        if name.endswith(("o_proj.weight", "down_proj.weight", "fc2.weight")):
            weights[name] = mx.zeros(weights[name].shape)
    if head.before_norm:
        weights["norm.weight"] = _final_norm(target).weight
    return weights


def _predicts(target: Any, head: MTPHead, hidden: mx.array) -> mx.array:
    """The head's predictions past position 0 (whose input some families zero)."""
    states = head(embed(target, TOKENS), hidden, head.make_cache())
    return mx.argmax(logits(target, states), axis=-1)[:, 1:]


def test_a_hand_wired_head_predicts_right_only_when_wired_as_the_reference(
    target: Any, tiny: TinyModels, tmp_path: Path
) -> None:
    folder = _checkpoint(tmp_path / "glm", target, _wired(target), tiny.target)
    head = load_head(folder, target, next_n_config(target.model_type))
    no_cache = [None] * len(target.layers)
    hidden, want = hidden_and_logits(target, TOKENS, no_cache, head.before_norm)
    right = mx.argmax(want, axis=-1)[:, 1:]
    assert mx.array_equal(_predicts(target, head, hidden), right)
    # The other side of the final norm, or the halves of fc's input swapped, miss.
    other, _ = hidden_and_logits(target, TOKENS, no_cache, not head.before_norm)
    assert not mx.array_equal(_predicts(target, head, other), right)
    swapped = head_of(target, next_n_config(target.model_type))
    swapped.load_weights(list(_wired(target, swapped=True).items()))
    assert not mx.array_equal(_predicts(target, swapped, hidden), right)


# DeepSeek-V3's 61 layers take seconds a reply here: one k for it.
_DRAFTED = [(f, k) for f in FAMILIES for k in (1, 4, None) if f != "deepseek_v3" or k is None]


@pytest.mark.parametrize(("family", "k"), _DRAFTED)
def test_a_reply_drafted_by_the_next_n_head_is_the_targets_greedy_reply(
    family: str, k: int | None
) -> None:
    from mlx_lm.generate import generate_step

    from app.engine.recurrent import install

    target = _model(family)
    install(target)
    head = head_of(target, next_n_config(target.model_type))
    head.load_weights(list(_random_head(target).items()))
    decoder = Decoder(target, MTPDraft(target, head))
    params = GenerationParams(temperature=0, drafting=DraftSetting.of(k))
    for prompt in ([3, 9, 27, 81, 243, 100, 7, 50], [5, 6, 7] * 20):
        turns = take_turns([decoder.generate(prompt, params)], 20)
        plain = [int(t) for t, _ in generate_step(mx.array(prompt), target, max_tokens=20)]
        assert turns.replies[0][:20] == plain
        assert k is None or sum(r.k for r in turns.rounds[0]) > 0  # it drafted


def test_a_quantized_import_keeps_the_next_n_layer_where_mlx_lm_leaves_it_out(
    target: Any, tiny: TinyModels, tmp_path: Path
) -> None:
    folder = _checkpoint(tmp_path / "glm", target, _random_head(target), tiny.target)
    out = import_folder(folder, tmp_path / "models", q_bits=8)
    assert has_head(out)
    loaded = load_model(out)  # strict: the layer is where mlx-lm's sanitize drops it
    head = load_head(out, loaded.model, loaded.config)
    assert isinstance(head.fc, nn.QuantizedLinear)
    switches = [m for _, m in head.named_modules() if isinstance(m, QuantizedSwitchLinear)]
    # Its experts too, where it has them (MiMo's heads are dense).
    assert switches or target.model_type.startswith("mimo")


def test_a_glm_without_its_next_n_layer_or_with_several_says_so(
    target: Any, tiny: TinyModels, tmp_path: Path
) -> None:
    folder = _checkpoint(tmp_path / "glm", target, {}, tiny.target)  # as mlx-lm converts it
    assert head_problem(folder) == (
        "glm's weights leave out the MTP head its config names; `tandem models import` "
        "of its Hugging Face checkpoint keeps it"
    )
    if target.model_type != "mimo_v2_flash":  # it drafts with the first of its three
        assert head_problem(folder, next_n_config(target.model_type, next_n=2)) == (
            "glm: Tandem drafts with one next-n layer, not 2"
        )


def test_deepseek_v3s_fp8_next_n_layer_loads_dequantized_and_imports_quantized(
    tiny: TinyModels, tmp_path: Path
) -> None:
    target = _model("deepseek_v3")
    folder = _checkpoint(tmp_path / "deepseek", target, _random_head(target), tiny.target)
    held = as_fp8(folder)
    assert has_head(folder)
    loaded = load_model(folder, fuse=False)  # mlx-lm's sanitize dequantizes the model's own
    head = _params(load_head(folder, loaded.model, loaded.config))
    n = next_n_config("deepseek_v3")["num_hidden_layers"]
    q_a = head["layers.0.self_attn.q_a_proj.weight"]
    assert q_a.dtype == mx.bfloat16
    want = held[f"model.layers.{n}.self_attn.q_a_proj.weight"]
    assert mx.allclose(q_a.astype(mx.float32), want, rtol=1e-2, atol=1e-3)
    # Dequantized as it loads, fp8 is quantized again on import, its head with it.
    out = import_folder(folder, tmp_path / "models", q_bits=8)
    quantized = load_head(out, load_model(out).model, json.loads((out / "config.json").read_text()))
    assert isinstance(quantized.layers[0].self_attn.q_a_proj, nn.QuantizedLinear)


@pytest.mark.parametrize("family", ["deepseek_v32", "mimo", "mimo_v2_flash", "nemotron_h"])
def test_requests_whose_heads_step_together_each_get_the_greedy_reply(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlx_lm.generate import generate_step

    from app.engine import merged
    from app.engine.recurrent import install

    target = _model(family)
    install(target)
    head = head_of(target, next_n_config(target.model_type))
    head.load_weights(list(_random_head(target).items()))
    stepped: list[int] = []
    alone = merged._heads_forward

    def spied(model: Any, tokens: Any, caches: Any) -> Any:
        stepped.append(len(tokens))
        return alone(model, tokens, caches)

    monkeypatch.setattr(merged, "_heads_forward", spied)
    decoder = Decoder(target, MTPDraft(target, head))
    prompts = [[3, 9, 27, 81, 243, 100, 7, 50], [5, 6, 7] * 6, [11, 12, 13, 14]]
    params = GenerationParams(temperature=0, drafting=DraftSetting.of(3))
    turns = take_turns([decoder.generate(p, params) for p in prompts], 16)
    for prompt, reply in zip(prompts, turns.replies, strict=True):
        plain = [int(t) for t, _ in generate_step(mx.array(prompt), target, max_tokens=16)]
        assert reply == plain
    assert 3 in stepped  # the three heads (DeepSeek-V3.2's caches listed) stepped as one


def test_nemotron_hs_head_norms_load_as_stored_from_its_hugging_face_checkpoint(
    tiny: TinyModels, tmp_path: Path
) -> None:
    target = _model("nemotron_h")
    weights = _random_head(target)
    folder = _checkpoint(tmp_path / "nemotron", target, weights, tiny.target)
    # Its Mamba convolutions as Hugging Face stores them, (channels, 1, kernel): the test
    # Qwen3.5's 1 + w norms go by, which is not Nemotron-H's rule.
    _rewrite(folder, lambda s: {k: v.moveaxis(1, 2) if "conv1d.weight" in k else v
                                for k, v in s.items()})  # fmt: skip
    loaded = load_model(folder, fuse=False)
    head = _params(load_head(folder, loaded.model, loaded.config))
    for name in ("norm.weight", "pre_fc_norm_hidden.weight", "layers.0.norm.weight"):
        assert mx.array_equal(head[name], weights[name]), name


def test_mimo_v2_flashs_head_is_the_first_of_its_three_mtp_layers(
    tiny: TinyModels, tmp_path: Path
) -> None:
    target = _model("mimo_v2_flash")
    first = _random_head(target)
    folder = _checkpoint(tmp_path / "mimo", target, first, tiny.target)
    # The later layers: other weights under the same names.
    stored = _rewrite(folder, lambda s: s | {
        k.replace(".0.", f".{layer}.", 1): v + layer
        for k, v in s.items() if k.startswith("model.mtp.layers.0.") for layer in (1, 2)
    })  # fmt: skip
    assert "model.mtp.layers.0.pre_mlp_layernorm.weight" in stored  # the checkpoint's name
    head = _params(load_head(folder, target, next_n_config("mimo_v2_flash")))
    assert head.keys() == first.keys()
    assert all(mx.array_equal(head[name], value) for name, value in first.items())


def test_mimo_v2_flashs_head_attends_within_the_models_window() -> None:
    target = _model("mimo_v2_flash")
    head = head_of(target, next_n_config("mimo_v2_flash"))
    head.load_weights(list(_random_head(target).items()))
    window = target.args.sliding_window_size
    mx.random.seed(3)
    hidden = mx.random.normal((1, 3 * window, target.args.hidden_size))
    tokens = mx.arange(3 * window)[None] % 300
    before = head(embed(target, tokens), hidden, head.make_cache())
    changed = head(embed(target, tokens), hidden.at[:, 0].add(5.0), head.make_cache())
    # The first row is read by the positions within the window after it, and no others.
    assert not mx.allclose(before[:, :window], changed[:, :window])
    assert mx.array_equal(before[:, window:], changed[:, window:])


@pytest.mark.parametrize(
    ("family", "zeroed"),
    [("deepseek_v3", "embedding"), ("glm4_moe", "embedding"), ("mimo", "input"),
     ("mimo_v2_flash", None), ("nemotron_h", None)],
)  # fmt: skip
def test_a_heads_input_at_position_0_is_zeroed_as_vllms_layer_of_its_family_does(
    family: str, zeroed: str | None
) -> None:
    target = _model(family)
    head = head_of(target, next_n_config(family))
    head.load_weights(list(_random_head(target).items()))
    mx.random.seed(2)
    hidden = mx.random.normal((1, TOKENS.shape[1], target.args.hidden_size))
    other_token = TOKENS.at[0, 0].add(1)  # position 0's token, then its state, changed
    other_state = hidden.at[:, 0].add(1.0)

    def reads(tokens: mx.array, states: mx.array, cache: list[Any]) -> mx.array:
        return head(embed(target, tokens), states, cache)

    same = reads(TOKENS, hidden, head.make_cache())
    token_read = not mx.allclose(same, reads(other_token, hidden, head.make_cache()))
    state_read = not mx.allclose(same, reads(TOKENS, other_state, head.make_cache()))
    reads_at_0 = {"embedding": (False, True), "input": (False, False), None: (True, True)}
    assert (token_read, state_read) == reads_at_0[zeroed]

    # Past position 0 every input counts: the same rows read after one already there.
    def after_one() -> list[Any]:
        cache = head.make_cache()
        reads(TOKENS[:, :1], hidden[:, :1], cache)
        return cache

    assert not mx.allclose(
        reads(TOKENS, hidden, after_one()), reads(other_token, hidden, after_one())
    )
