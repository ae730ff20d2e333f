"""Test helpers shared across test modules: fake engines, keyrings, servers and model files.

Test modules import these from here, never from one another.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf
import keyring
import keyring.errors
import mlx.core as mx
import numpy as np
import openai
from keyring.backend import KeyringBackend
from PySide6.QtCore import Qt

from app.engine import (
    Chunk,
    Finished,
    GenerationParams,
    LoadedModel,
    Message,
    ModelPair,
    Origin,
    Stats,
)
from app.engine.calibrate import CalibrationPoint, CalibrationResult
from app.engine.costs import K_MAX, CostProfile, geometric
from app.engine.types import FinishReason
from app.testing.tiny import CHATML_TEMPLATE

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam
    from pytestqt.qtbot import QtBot

    from app.services import EngineService
    from app.ui.main_window import MainWindow
    from tests.conftest import TinyModels

# --- GGUF files written the way llama.cpp's converter writes them ---------------------------------

Q = gguf.GGMLQuantizationType


TokenizerMeta = Callable[[gguf.GGUFWriter], None]


_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "lm_head.weight": "output.weight",
    "model.norm.weight": "output_norm.weight",
}


_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


_POST_ATTENTION = {"gemma3": "post_attention_norm"}


_GEMMA_LAYER = {
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim in numpy."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def gguf_name(name: str, arch: str) -> str:
    if name in _TOP:
        return _TOP[name]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
    assert m, name
    module = m.group(2)
    if arch == "gemma3" and module in _GEMMA_LAYER:
        short = _GEMMA_LAYER[module]
    elif module == "post_attention_layernorm":
        short = _POST_ATTENTION.get(arch, "ffn_norm")
    else:
        short = _LAYER[module]
    return f"blk.{m.group(1)}.{short}.{m.group(3)}"


def write_gguf(
    path: Path,
    config: dict[str, Any],
    weights: dict[str, np.ndarray],
    tokenizer: TokenizerMeta,
    *,
    arch: str | None = None,
    qtype: Callable[[str, np.ndarray], Any] = lambda _name, _w: Q.F32,
    extra: dict[str, np.ndarray] | None = None,
) -> Path:
    """Writes Hugging Face weights as llama.cpp's converter would."""
    model_type = config["model_type"]
    arch = arch or {"gemma3_text": "gemma3"}.get(model_type, model_type)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_rope_freq_base(config["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if "head_dim" in config:
        w.add_key_length(config["head_dim"])
        w.add_value_length(config["head_dim"])
    if "sliding_window" in config:
        w.add_sliding_window(config["sliding_window"])
    tokenizer(w)
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    for name, value in weights.items():
        x = np.asarray(value, dtype=np.float32)
        if model_type == "llama" and ".q_proj." in name:
            x = permute(x, n_head, n_head)
        elif model_type == "llama" and ".k_proj." in name:
            x = permute(x, n_head, n_kv)
        if model_type == "gemma3_text" and name.endswith("norm.weight"):
            x = x + 1.0  # llama.cpp multiplies by the norm weight, Gemma by 1 + w
        kind = qtype(name, x)
        if kind == Q.F32:
            w.add_tensor(gguf_name(name, arch), x)
        elif kind == Q.F16:
            w.add_tensor(gguf_name(name, arch), x.astype(np.float16))
        elif kind == Q.I32:
            w.add_tensor(gguf_name(name, arch), x.astype(np.int32))
        else:
            w.add_tensor(gguf_name(name, arch), gguf.quants.quantize(x, kind), raw_dtype=kind)
    finish_gguf(w, extra or {})
    return path


def text_model_writer(
    path: Path, arch: str, args: Any, blocks: int, kv_heads: int | list[int] | None = None
) -> gguf.GGUFWriter:
    """A GGUF writer with the keys TextModel.set_gguf_parameters writes, from mlx-lm model
    ``args``, for ``blocks`` blocks (the model's layers and any MTP layers after them);
    ``kv_heads`` where the converter writes its own (one a layer, for LFM2)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(blocks)
    # gpt-oss's args leave it out (its config names 131072).
    w.add_context_length(getattr(args, "max_position_embeddings", 131_072))
    w.add_embedding_length(args.hidden_size)
    w.add_feed_forward_length(args.intermediate_size)
    w.add_head_count(args.num_attention_heads)
    w.add_head_count_kv(args.num_key_value_heads if kv_heads is None else kv_heads)
    w.add_rope_freq_base(getattr(args, "rope_theta", 10_000.0))
    eps = ("rms_norm_eps", "norm_eps", "layer_norm_epsilon")  # as each family's args name it
    w.add_layer_norm_rms_eps(next(getattr(args, k) for k in eps if hasattr(args, k)))
    if hasattr(args, "head_dim"):  # as TextModel writes it: where the config names it
        w.add_key_length(args.head_dim)
        w.add_value_length(args.head_dim)
    return w


# llama.cpp's names of a next-n layer's own tensors (constants.py, MODEL_TENSOR.NEXTN_*):
# the installed gguf package maps them for some architectures only.
_NEXTN_TENSORS = {
    "eh_proj": gguf.MODEL_TENSOR.NEXTN_EH_PROJ,
    "enorm": gguf.MODEL_TENSOR.NEXTN_ENORM,
    "hnorm": gguf.MODEL_TENSOR.NEXTN_HNORM,
    "shared_head.norm": gguf.MODEL_TENSOR.NEXTN_SHARED_HEAD_NORM,
}


def add_converted(
    w: gguf.GGUFWriter, arch: gguf.MODEL_ARCH, layers: int, tensors: Mapping[str, Any]
) -> None:
    """Adds mlx-lm's ``tensors`` to ``w`` as convert_hf_to_gguf.py writes them: experts
    stacked, the routing bias renamed, kv_b_proj's halves (mlx-lm's embed_q and
    unembed_out) as k_b_proj and v_b_proj, named by the gguf package's map for ``arch``,
    and a next-n layer (block ``layers``) under its nextn names."""
    blocks = layers + any(k.startswith(f"model.layers.{layers}.") for k in tensors)
    names = gguf.get_tensor_name_map(arch, blocks)
    for name, value in tensors.items():
        name = name.replace(".switch_mlp.", ".experts.")
        name = name.replace(".e_score_correction_bias", ".e_score_correction.bias")
        name = name.replace(".embed_q.", ".k_b_proj.").replace(".unembed_out.", ".v_b_proj.")
        module = name.removeprefix(f"model.layers.{layers}.").removesuffix(".weight")
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if name.startswith(f"model.layers.{layers}.") and module in _NEXTN_TENSORS:
            mapped = gguf.TENSOR_NAMES[_NEXTN_TENSORS[module]].format(bid=layers) + ".weight"
        assert mapped is not None, name
        w.add_tensor(mapped, np.array(value, dtype=np.float32))


def kv_b_whole(tensors: Mapping[str, mx.array], rank: int | None) -> dict[str, mx.array]:
    """``tensors`` with each MLA layer's ``embed_q`` and ``unembed_out`` (mlx-lm's split,
    latent ``rank`` wide) joined back into the ``kv_b_proj`` Hugging Face checkpoints and
    older GGUF files store."""
    out = {}
    for name, value in tensors.items():
        if ".embed_q." in name:
            v = tensors[name.replace(".embed_q.", ".unembed_out.")]
            whole = mx.concatenate([value.swapaxes(-1, -2), v], axis=1)  # (heads, nope + v, rank)
            out[name.replace(".embed_q.", ".kv_b_proj.")] = whole.reshape(-1, rank)
        elif ".unembed_out." not in name:
            out[name] = value
    return out


def add_routing(w: gguf.GGUFWriter, args: Any) -> None:
    """A DeepSeek-V3-kind mixture of experts' keys (sigmoid routing, shared experts, dense
    leading layers), as Glm4MoeModel and DeepseekV2Model write them, from mlx-lm ``args``."""
    w.add_expert_used_count(args.num_experts_per_tok)
    w.add_expert_count(args.n_routed_experts)
    w.add_expert_feed_forward_length(args.moe_intermediate_size)
    w.add_expert_shared_count(args.n_shared_experts)
    w.add_leading_dense_block_count(args.first_k_dense_replace)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(args.routed_scaling_factor)
    w.add_expert_weights_norm(args.norm_topk_prob)


def finish_converted(
    w: gguf.GGUFWriter,
    arch: gguf.MODEL_ARCH,
    layers: int,
    tensors: Mapping[str, Any],
    tokenizer: TokenizerMeta,
    pre: str,
) -> None:
    """Ends a file as convert_hf_to_gguf.py does: the next-n layer's count where ``tensors``
    hold one, the tokenizer with llama.cpp's name ``pre`` for its pre-tokenizer, the
    tensors (:func:`add_converted`); then writes and closes it."""
    if any(k.startswith(f"model.layers.{layers}.") for k in tensors):
        w.add_nextn_predict_layers(1)
    tokenizer(w)
    w.add_tokenizer_pre(pre)
    add_converted(w, arch, layers, tensors)
    finish_gguf(w, {})


def head_logits(target: Any, head: Any, tokens: mx.array) -> mx.array:
    """An MTP head's logits for the tokens after each of ``tokens`` but the last, beside
    the target's states."""
    from mlx_lm.models.cache import make_prompt_cache

    from app.engine import mtp

    hidden, _ = mtp.hidden_and_logits(target, tokens, make_prompt_cache(target))
    states = head(mtp.embed(target, tokens[:, 1:]), hidden[:, :-1], head.make_cache())
    return mtp.logits(target, states)


def assert_same_model_and_head(
    loaded: Any, out: Path, target: Any, head: Any, tokens: mx.array
) -> None:
    """The model imported into ``out`` (``loaded``, unfused) gives ``target``'s logits, and
    the MTP head it carries gives ``head``'s."""
    from app.engine import mtp

    imported = mtp.load_head(out, loaded.model, loaded.config)
    for got, want in (
        (loaded.model(tokens), target(tokens)),
        (head_logits(loaded.model, imported, tokens), head_logits(target, head, tokens)),
    ):
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)


def converted(own: str, x: np.ndarray, args: Any) -> np.ndarray:
    """A tensor as llama.cpp's converter writes it for Granite and Nemotron-H (Mamba2Model,
    GraniteModel's llama permutation): ``own`` is its name within its mixer or attention.
    A is -exp(A_log), A and D get an axis, the gated norm goes into groups, the convolution
    loses its axis of 1, Q/K rows are permuted as llama's. ``args``: mlx-lm's, in Granite's
    or Nemotron-H's names."""
    if own == "A_log":
        x = -np.exp(x)
    if own in ("A_log", "D"):
        return x.reshape(-1, 1)
    if own == "norm.weight":
        return x.reshape(getattr(args, "mamba_n_groups", None) or args.n_groups, -1)
    if own == "conv1d.weight":  # MLX's (C, K, 1)
        return x.squeeze(-1)
    if own == "q_proj.weight":
        return permute(x, args.num_attention_heads, args.num_attention_heads)
    if own == "k_proj.weight":
        return permute(x, args.num_attention_heads, args.num_key_value_heads)
    return x


# mlx-lm's names of a Mamba2 mixer's and an attention block's tensors within a layer (Granite
# 4's, Falcon-H1's), and llama.cpp's tensor and suffix for each.
MAMBA2_AND_ATTENTION = {
    "mamba.in_proj.weight": (gguf.MODEL_TENSOR.SSM_IN, "weight"),
    "mamba.conv1d.weight": (gguf.MODEL_TENSOR.SSM_CONV1D, "weight"),
    "mamba.conv1d.bias": (gguf.MODEL_TENSOR.SSM_CONV1D, "bias"),
    "mamba.dt_bias": (gguf.MODEL_TENSOR.SSM_DT, "bias"),
    "mamba.A_log": (gguf.MODEL_TENSOR.SSM_A, None),
    "mamba.D": (gguf.MODEL_TENSOR.SSM_D, None),
    "mamba.norm.weight": (gguf.MODEL_TENSOR.SSM_NORM, "weight"),
    "mamba.out_proj.weight": (gguf.MODEL_TENSOR.SSM_OUT, "weight"),
    "self_attn.q_proj.weight": (gguf.MODEL_TENSOR.ATTN_Q, "weight"),
    "self_attn.k_proj.weight": (gguf.MODEL_TENSOR.ATTN_K, "weight"),
    "self_attn.v_proj.weight": (gguf.MODEL_TENSOR.ATTN_V, "weight"),
    "self_attn.o_proj.weight": (gguf.MODEL_TENSOR.ATTN_OUT, "weight"),
}


def block_tensor_name(tensor: Any, bid: int, suffix: str | None) -> str:
    """llama.cpp's name of block ``bid``'s ``tensor`` (a gguf MODEL_TENSOR), with ``suffix``."""
    base = gguf.TENSOR_NAMES[tensor].format(bid=bid)
    return base if suffix is None else f"{base}.{suffix}"


def add_mamba2_keys(
    w: gguf.GGUFWriter, conv: int, state: int, groups: int, heads: int, head_dim: int
) -> None:
    """The Mamba2 keys GraniteHybridModel.set_gguf_parameters writes (rope unused)."""
    w.add_ssm_conv_kernel(conv)
    w.add_ssm_state_size(state)
    w.add_ssm_group_count(groups)
    w.add_ssm_inner_size(heads * head_dim)
    w.add_ssm_time_step_rank(heads)


def imported_as(path: Path, out: Path, model: Any) -> dict[str, Any]:
    """Imports the GGUF file ``path`` into ``out`` and checks that the folder gives
    ``model``'s logits; returns its config."""
    from app.engine.loader import load_model
    from app.hub.gguf_import import import_gguf

    loaded = load_model(import_gguf(path, out), fuse=False)
    tokens = mx.array([[5, 17, 42, 99, 7, 250, 3]])
    got, want = np.array(loaded.model(tokens)), np.array(model(tokens))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return loaded.config


def assert_drafts_for_itself(folder: Path) -> None:
    """A model folder, its own draft, replies greedily with every draft accepted: its
    states went back after each round."""
    from app.engine import Message, load_pair
    from app.engine.generate import stream_reply
    from app.engine.types import DraftSetting, Finished, GenerationParams

    pair = load_pair(folder, folder)
    params = GenerationParams(temperature=0, max_tokens=12, drafting=DraftSetting.of(4))
    *_, end = stream_reply(pair, [Message("user", "Hi")], params)
    assert isinstance(end, Finished) and end.stats.accepted == end.stats.drafted > 0


def finish_gguf(w: Any, tensors: Mapping[str, np.ndarray]) -> None:
    """Adds ``tensors`` as they are to the GGUF writer ``w``, then writes and closes its file."""
    for name, x in tensors.items():
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def qwen3_next_edits(name: str, x: np.ndarray) -> tuple[str, np.ndarray]:
    """convert_hf_to_gguf.py's Qwen3NextModel.modify_tensors (Qwen3.5's too): ssm_a =
    -exp(A_log), dt_bias renamed, convolutions squeezed, and every norm but the gated one
    stored as 1 + w."""
    if name.endswith(".A_log"):
        return name, -np.exp(x)
    if name.endswith(".dt_bias"):
        return name.rpartition(".dt_bias")[0] + ".dt_proj.bias", x
    if "conv1d" in name:
        return name, x.squeeze()
    if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        return name, x + 1
    return name, x


def qwen3_next_parameters(w: gguf.GGUFWriter, args: Any) -> None:
    """The Gated DeltaNet keys of Qwen3NextModel.set_gguf_parameters (Qwen3.5's too), from
    mlx-lm model ``args``."""
    w.add_ssm_conv_kernel(args.linear_conv_kernel_dim)
    w.add_ssm_state_size(args.linear_key_head_dim)
    w.add_ssm_group_count(args.linear_num_key_heads)
    w.add_ssm_time_step_rank(args.linear_num_value_heads)
    w.add_ssm_inner_size(args.linear_value_head_dim * args.linear_num_value_heads)
    w.add_full_attention_interval(args.full_attention_interval)
    w.add_rope_dimension_count(int(args.head_dim * args.partial_rotary_factor))


def tiny_tokenizer(
    folder: Path, *, model: str = "gpt2", pre: str = "gpt-2", add_bos: bool | None = False
) -> TokenizerMeta:
    """The tiny model's byte-level BPE tokenizer as GGUF metadata, with llama.cpp's name
    ``pre`` for its pre-tokenizer; ``add_bos`` None leaves its key out."""
    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab: dict[str, int] = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    special = {a["content"] for a in tok["added_tokens"] if a["special"]}

    def add(w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model(model)
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types([3 if t in special else 1 for t in tokens])
        w.add_token_merges([" ".join(m) for m in tok["model"]["merges"]])
        w.add_bos_token_id(vocab["<|endoftext|>"])
        w.add_eos_token_id(vocab["<|im_end|>"])
        w.add_pad_token_id(vocab["<|endoftext|>"])
        if add_bos is not None:
            w.add_add_bos_token(add_bos)
        w.add_chat_template(CHATML_TEMPLATE)

    return add


def weights_of(folder: Path) -> dict[str, np.ndarray]:
    loaded: dict[str, np.ndarray] = {}
    for file in sorted(folder.glob("*.safetensors")):
        arrays = mx.load(str(file))
        assert isinstance(arrays, dict)
        loaded.update({k: np.array(v) for k, v in arrays.items()})
    return loaded


# --- `tandem serve` subprocesses ------------------------------------------------------------------

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Say something about speculative decoding."}
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kill(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(10)


# --- a keychain in memory (the `memory` fixture in conftest.py puts it in place) ------------------


class MemoryKeyring(KeyringBackend):
    """Keeps secrets in a dict; ``error`` makes every call raise it instead."""

    priority = -5  # never chosen by keyring itself for other tests (fail.Keyring is 0)

    def __init__(self) -> None:
        super().__init__()
        self.store: dict[tuple[str, str], str] = {}
        self.error: Exception | None = None

    def get_password(self, service: str, username: str) -> str | None:
        self._maybe_fail()
        return self.store.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self._maybe_fail()
        self.store[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self._maybe_fail()
        if self.store.pop((service, username), None) is None:
            raise keyring.errors.PasswordDeleteError("not found")

    def _maybe_fail(self) -> None:
        if self.error is not None:
            raise self.error


# --- fake loads and reply streams for the engine thread -------------------------------------------


def _fake_load(target: str, _draft: str | None, progress=None, loaded=None) -> ModelPair:
    return ModelPair(LoadedModel(Path(target), model=None, tokenizer=None, config={}))  # type: ignore[arg-type]  # no weights


class Pause:
    """Holds a scripted reply, and so the engine thread, between two tokens while a test acts."""

    def __init__(self) -> None:
        self._asked, self._holding, self._released = (threading.Event() for _ in range(3))

    def __call__(self) -> None:
        """Where the reply stands between two tokens: it waits here once asked, until released."""
        if self._asked.is_set() and not self._released.is_set():
            self._holding.set()
            self._released.wait(10)

    def hold(self) -> None:
        """Returns once the reply waits: until :meth:`release` the engine takes nothing in."""
        self._asked.set()
        assert self._holding.wait(5), "the reply never reached its next token"

    def release(self) -> None:
        self._released.set()


def _scripted(
    chunks: int, delay: float = 0.0, fail_at: int | None = None, pause: Pause | None = None
):
    def stream(
        _pair: ModelPair,
        _messages: Sequence[Message],
        _params: GenerationParams,
        cancel: threading.Event,
        control=None,
        decoder=None,
    ) -> Iterator[Chunk | Finished]:
        ids = []
        reason: FinishReason = "length"
        for i in range(chunks):
            if cancel.is_set():
                reason = "cancelled"
                break
            if i == fail_at:
                raise RuntimeError("out of memory")
            if pause is not None:
                pause()
            time.sleep(delay)
            ids.append(i)
            yield Chunk(f"t{i} ", (i,), (Origin.DRAFT,))
        yield Finished(Stats(tokens=len(ids)), reason, tuple(ids), (Origin.DRAFT,) * len(ids))

    return stream


def _slow_to_stop(lag: float = 0.3):
    """A reply that streams until cancelled, then takes ``lag`` seconds to end, as a round would."""

    def stream(
        _pair: ModelPair,
        _messages: Sequence[Message],
        _params: GenerationParams,
        cancel: threading.Event,
        control=None,
        decoder=None,
    ) -> Iterator[Chunk | Finished]:
        ids: list[int] = []
        while not cancel.is_set() and len(ids) < 10_000:
            ids.append(len(ids))
            yield Chunk(f"t{ids[-1]} ", (ids[-1],), (Origin.DRAFT,))
            time.sleep(0.005)
        time.sleep(lag)  # the round in flight finishes before the cancel is seen
        yield Finished(Stats(tokens=len(ids)), "cancelled", tuple(ids), (Origin.DRAFT,) * len(ids))

    return stream


def _reads_then_replies(readings: int = 1, gate: threading.Event | None = None, reused: int = 0):
    """A reply that reads a 1,204-token prompt, a 512-token chunk per Reading, then says "Hi".

    The cache held ``reused`` tokens of it already. With ``gate``, the reply
    waits for the gate after its Readings, as a long prompt's next chunk would.
    """
    from app.engine.types import Reading

    def stream(_pair, _messages, _params, cancel, control=None, decoder=None):  # type: ignore[no-untyped-def]
        for i in range(readings):
            yield Reading(reused + 512 * i, 1_204, reused)
        if gate is not None:
            gate.wait(10)
        yield Chunk("Hi", (1,), (Origin.TARGET,))
        yield Finished(Stats(tokens=1, prompt_tokens=1_204), "stop", (1,), (Origin.TARGET,))

    return stream


def _loaded(qtbot: QtBot, service: EngineService, target: str = "t", draft: str | None = None):
    with qtbot.waitSignal(service.pair_loaded, timeout=20_000) as blocker:
        service.load_pair(target, draft)
    return blocker.args[0]


class _Weights:
    """Stands in for a model's arrays; a weak reference says whether anything still holds it."""


class _Engine:
    """A fake load and stream: every load makes new weights, the first reply raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error: Exception | None = error
        self.weights: list[weakref.ref[_Weights]] = []
        self.freed = 0

    def load(self, target: str, _draft: str | None, progress=None, loaded=None) -> ModelPair:
        weights = _Weights()
        self.weights.append(weakref.ref(weights))
        return ModelPair(LoadedModel(Path(target), model=weights, tokenizer=None, config={}))  # type: ignore[arg-type]  # a stand-in

    def stream(self, pair: ModelPair, _messages, _params, _cancel, control=None, decoder=None):
        for i in range(2):
            yield Chunk(f"t{i} ", (i,), (Origin.TARGET,))
        if self.error is not None:
            error, self.error = self.error, None
            raise error  # this frame holds the pair, as MLX's would hold arrays
        yield Finished(Stats(tokens=2), "stop", (0, 1), (Origin.TARGET,) * 2)


# --- Tune sweeps and cost profiles ----------------------------------------------------------------

BUILTIN = ["built-in one", "built-in two", "built-in three"]


# v(m)/v(1) for m = 1 … 17 as MLX's CUDA backend prices a 4-bit target: a kernel per row
# below 8 rows, one tile from 8, so 8 to 16 tokens verify for barely more than 7 do.
CUDA_STEPS = (1, 2.1, 2.8, 3.4, 4.4, 5.2, 5.7, *(1.7,), *(1.75,) * 8, 2.6)


STEP = 0.025  # seconds of one plain target step


CUDA_PROFILE = CostProfile(
    verify=tuple(s * STEP for s in CUDA_STEPS), draft_step=0.003, context=512, device="gpu"
)


PROFILED = CalibrationResult(
    points=(
        CalibrationPoint(0, 40.0, None, None, 640, 16.0),
        CalibrationPoint(1, 52.0, 0.9, 1.0, 640, 12.3),
        CalibrationPoint(2, 60.0, 0.87, 2.0, 640, 10.7),
        CalibrationPoint(3, 63.0, 0.86, 3.0, 640, 10.2),
        CalibrationPoint(4, 66.0, 0.85, 4.0, 640, 9.7),
        CalibrationPoint(5, 69.0, 0.85, 5.0, 640, 9.3),
        CalibrationPoint(6, 71.0, 0.84, 6.0, 640, 9.0),
        CalibrationPoint(8, 73.0, 0.83, 8.0, 640, 8.8),
        CalibrationPoint(10, 66.0, 0.8, 10.0, 640, 9.7),
        CalibrationPoint(12, 61.0, 0.78, 12.0, 640, 10.5),
        CalibrationPoint(14, 57.0, 0.75, 14.0, 640, 11.2),
        CalibrationPoint(16, 45.0, 0.72, 16.0, 640, 14.2),
        CalibrationPoint(None, 74.0, 0.84, 7.2, 640, 8.6),
    ),
    best_k=8,
    baseline_tps=40.0,
    prompts=5,
    max_tokens=128,
    pair="Qwen2.5-7B + Qwen2.5-0.5B",
    profile=CUDA_PROFILE,
    accept=geometric(0.85),
    k_max=K_MAX,
)


# --- driving the window ---------------------------------------------------------------------------


def _load(qtbot: QtBot, window: MainWindow, target: str, draft: str = "") -> None:
    window.model_bar.target_edit.setText(target)
    window.model_bar.draft_edit.setText(draft)
    with qtbot.waitSignal(window.service.pair_loaded, timeout=20_000):
        qtbot.mouseClick(window.model_bar.load_button, Qt.MouseButton.LeftButton)


def _send(qtbot: QtBot, window: MainWindow, text: str, timeout: int = 20_000) -> None:
    window.composer.editor.setPlainText(text)
    with qtbot.waitSignal(window.service.generation_finished, timeout=timeout):
        qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)


SCRIPT = ((4, 4), (4, 2), (4, 0), (0, 0))  # (k, accepted) per round


def _rounds(  # type: ignore[no-untyped-def]
    script=SCRIPT, seen_k: list | None = None, hold=None, auto=False
):
    """A stream that plays rounds; ``seen_k`` records the control's k before each.

    With ``auto``, drafting rounds say Auto chose their k.
    """
    from app.engine.types import Chunk, RoundStat

    def stream(_pair, _messages, params, cancel, control=None, decoder=None):  # type: ignore[no-untyped-def]
        ids: list[int] = []
        origins: list[Origin] = []
        for i, (k, accepted) in enumerate(script):
            if hold is not None:
                hold(i)
            if seen_k is not None:
                seen_k.append(control.setting.num_draft)
            if cancel.is_set():
                break
            orig = [Origin.DRAFT] * accepted
            orig.append(
                Origin.TARGET if k == 0 else Origin.BONUS if accepted == k else Origin.CORRECTION
            )
            pieces = tuple(f"r{i}t{j} " for j in range(len(orig)))
            rnd = RoundStat(len(orig), k, accepted, seconds=0.01, auto=auto and k > 0)
            ids += range(len(orig))
            origins += orig
            yield Chunk("".join(pieces), tuple(range(len(orig))), tuple(orig), pieces, rnd, 50.0)
        drafted = sum(k for k, _ in script)
        accepted = sum(a for _, a in script)
        stats = Stats(
            tokens=len(ids),
            drafted=drafted,
            accepted=accepted,
            target_calls=len(script),
            draft_rounds=sum(1 for k, _ in script if k),
            num_draft=params.drafting.num_draft,
            k_min=4,
            k_max=4,
            generation_seconds=0.04,
            baseline_tps=50.0,
        )
        yield Finished(stats, "stop", tuple(ids), tuple(origins))

    return stream


# --- a GGUF copy of the tiny target ---------------------------------------------------------------


def _gguf(tiny: TinyModels, tmp_path: Path) -> Path:
    from tests.fakes import tiny_tokenizer, weights_of, write_gguf

    config = json.loads((tiny.target / "config.json").read_text())
    return write_gguf(
        tmp_path / "tiny.gguf", config, weights_of(tiny.target), tiny_tokenizer(tiny.target)
    )


# --- Hub cache repos and broken safetensors -------------------------------------------------------


def make_cache_repo(
    cache: Path, repo_id: str, model: Path, commit: str = "a" * 40, *, ref: str | None = "main"
) -> Path:
    """Lays ``model`` out as huggingface_hub does: blobs, refs and a snapshot of symlinks."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    blobs, snapshot = repo / "blobs", repo / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for file in sorted(model.iterdir()):
        data = file.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        (snapshot / file.name).symlink_to(Path("../../blobs") / digest)
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def _truncated_header(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 5000) + b'{"a": ')


def _truncated_data(folder: Path) -> None:
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])


def _garbage_header(folder: Path) -> None:
    header = b"not json at all!"
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)


# --- `tandem` subprocesses ------------------------------------------------------------------------


def _tandem(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        input=stdin,
    )


def _tandem_in(
    home: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``tandem`` with its data folder and Hub cache under ``home``."""
    env = {"XDG_DATA_HOME": str(home / "data"), "HF_HUB_CACHE": str(home / "hf")}
    return _tandem(*args, env=env, stdin=stdin)


def _tandem_here(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``tandem`` run through ``app.cli.main`` in this process, as ``_tandem`` runs it in another.

    For checks that are not about the process boundary: it saves the second or so a new
    process spends importing MLX and the tokenizer libraries. An exception that escapes
    ``main`` is raised here, failing the test as its traceback would in the process.
    """
    import contextlib
    import io

    from app.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_stdin = dict(os.environ), sys.stdin
    os.environ.update({"HF_HUB_OFFLINE": "1", **(env or {})})
    sys.stdin = io.StringIO(stdin or "")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's --version and usage errors
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        sys.stdin = saved_stdin
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["tandem", *args], code, out.getvalue(), err.getvalue())


def _tandem_in_here(
    home: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``_tandem_in`` through ``_tandem_here``: the data folder and Hub cache under ``home``."""
    from unittest import mock

    import huggingface_hub.constants
    import huggingface_hub.utils._cache_manager

    hf = str(home / "hf")
    env = {"XDG_DATA_HOME": str(home / "data"), "HF_HUB_CACHE": hf}
    # The Hub reads its cache folder once, when it is imported.
    with (
        mock.patch.object(huggingface_hub.constants, "HF_HUB_CACHE", hf),
        mock.patch.object(huggingface_hub.utils._cache_manager, "HF_HUB_CACHE", hf),
    ):
        return _tandem_here(*args, env=env, stdin=stdin)


def served_url(process: subprocess.Popen[str], timeout: float = 60) -> str:
    """The base URL a ``tandem serve`` process announces on its first line of stdout."""
    assert process.stdout is not None
    lines: list[str] = []
    stdout = process.stdout
    reader = threading.Thread(target=lambda: lines.append(stdout.readline()))
    reader.start()
    reader.join(timeout)
    assert lines and "serving on" in lines[0], (lines, process.poll())
    return lines[0].split("serving on", 1)[1].strip()


def _collect(service: EngineService) -> tuple[dict[int, str], dict[int, object]]:
    """Each reply's text and how it ended (its result or failure), by request id, as they come."""
    texts: dict[int, str] = {}
    ends: dict[int, object] = {}

    def on_tokens(batch: Any) -> None:
        texts[batch.request_id] = texts.get(batch.request_id, "") + batch.text

    def on_end(result: Any) -> None:
        assert result.request_id is not None
        ends[result.request_id] = result

    service.tokens_generated.connect(on_tokens)
    service.generation_finished.connect(on_end)
    service.failed.connect(on_end)
    return texts, ends


def _prompt_threads(monkeypatch: Any) -> tuple[list[int], set[int], Callable[..., Any]]:
    """Records the threads prompts are made on and the engine's (the stream to give it)."""
    from app.engine import generate
    from app.services import engine_service

    made_on: list[int] = []
    engine_threads: set[int] = set()
    original = generate.prompt_ids  # engine_service imported it from there

    def recording(*args: Any, **kwargs: Any) -> Any:
        made_on.append(threading.get_ident())
        return original(*args, **kwargs)

    def stream(*args: Any, **kwargs: Any) -> Any:
        engine_threads.add(threading.get_ident())
        return generate.stream_reply(*args, **kwargs)

    monkeypatch.setattr(engine_service, "prompt_ids", recording)
    monkeypatch.setattr(generate, "prompt_ids", recording)
    return made_on, engine_threads, stream


KEY = "test-key-123"


@dataclass(frozen=True)
class Server:
    url: str  # ends in /v1
    port: int
    process: subprocess.Popen[str]

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=30)


def _start(args: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "TANDEM_DEBUG_LOG": "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "app", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


# Norms a Hugging Face Qwen3.5 or Qwen3-Next checkpoint stores as w and applies as 1 + w
# (mlx-lm's sanitize); the Gated DeltaNet's gated norm is not one of them.
NORMS_STORED_AS_W = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "q_norm.weight",
    "k_norm.weight",
    "model.norm.weight",
)


def chi_square(counts: np.ndarray, p: np.ndarray) -> tuple[float, float]:
    """Goodness-of-fit statistic of ``counts`` against ``p``, and its 0.1 % critical value.

    Tokens expected fewer than 5 times are pooled into one bin.
    """
    n = counts.sum()
    expected = n * p
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    z = 3.09  # one-sided 0.1 %: Wilson-Hilferty approximation of the chi-square quantile
    critical = df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3
    return stat, critical


# DeepSeek-V3 stores its layers' projections in fp8 (e4m3), one scale a 128 x 128 block.
FP8 = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}


def as_fp8(folder: Path, scale: float = 0.5) -> dict[str, mx.array]:
    """Rewrites ``folder``'s ``model.safetensors`` with its decoder layers' projections (a
    next-n layer's included, not its ``eh_proj``) in fp8 beside their ``weight_scale_inv``,
    as DeepSeek-V3's are stored, and says so in its config.

    Returns:
        Each rewritten weight as its fp8 bytes and scale give it back.
    """
    path = folder / "model.safetensors"
    loaded = mx.load(str(path))
    assert isinstance(loaded, dict)
    tensors, held = dict(loaded), {}
    for key, value in loaded.items():
        if not (key.startswith("model.layers.") and key.endswith("_proj.weight")):
            continue
        if value.ndim != 2 or key.endswith("eh_proj.weight"):
            continue
        q = mx.to_fp8(value / scale)
        tensors[key] = q
        blocks = tuple(-(-n // 128) for n in value.shape)
        tensors[key + "_scale_inv"] = mx.full(blocks, scale)
        held[key] = mx.from_fp8(q, dtype=mx.float32) * scale
    mx.save_safetensors(str(path), tensors)
    _mark_fp8(path, list(held))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": FP8}))
    return held


def _mark_fp8(path: Path, names: list[str]) -> None:
    """Gives ``names`` the safetensors type fp8 files have (MLX writes their bytes as U8)."""
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    for name in names:
        header[name]["dtype"] = "F8_E4M3"
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + length :])
