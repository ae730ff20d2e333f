"""Conversion: GGUF tensors and metadata to an MLX model in the Hugging Face layout.

Each tensor is dequantized with the ``gguf`` package's numpy code, renamed to
the names mlx-lm loads and freed of llama.cpp's own edits (permuted Q/K rows,
shifted norms, and Qwen3.5's and Qwen3-Next's in :mod:`.hybrid`); ``config.json``
is rebuilt from the metadata.
"""

from __future__ import annotations

import math
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.loader import (
    check_sizes,
    model_classes,
    read_error,
)
from app.errors import ModelError, first_line, one_line
from app.hub.gguf_import import mamba2, short_conv
from app.hub.gguf_import.common import (
    _DTYPES,
    _SAFETENSORS_CODES,
    ImportProgress,
    _check_cancel,
    _f32,
    _granite_experts,
    _granite_multipliers,
    _heads_kv,
    _int,
    _Joined,
    _Metadata,
    _Planned,
)
from app.hub.gguf_import.files import _write_json
from app.hub.gguf_import.hybrid import (
    _check_head,
    _hf_shape,
    _hybrid_config,
    _join_qkvz,
    _mtp_layers,
    _mtp_name,
    _nested,
    _qkvz,
    _refuse_mtp,
    _undo_linear_attention,
)
from app.hub.gguf_import.quantize import _quantize
from app.hub.gguf_import.shards import _shard, _write_shards
from app.hub.gguf_import.tokenizer import _build_tokenizer
from app.hub.library import require_space

# The model types whose configs say whether attention and the MLP have biases.
_ATTENTION_BIAS = frozenset(
    {"llama", "glm4_moe", "granite", "granitemoe", "granitemoehybrid", "nemotron_h"}
)
_MLP_BIAS = frozenset({"llama", "granite", "granitemoehybrid", "nemotron_h"})

# Llama 3.1+ rope scaling (low_freq_factor, high_freq_factor, original context):
# GGUF keeps only the resulting per-frequency factors, so these are tried against them.
_LLAMA3_ROPE_CANDIDATES = ((1.0, 4.0, 8192),)

# expert_gating_func's value for sigmoid routing (llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE).
_SIGMOID = 2


_TOP_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
}


_BLOCK_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


_DENSE_MLP = ("ffn_gate", "ffn_up", "ffn_down")


# Gemma normalizes around both sublayers; its ffn_norm is the pre-feed-forward norm.
_GEMMA_BLOCK_TENSORS = {
    **_BLOCK_TENSORS,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


# Qwen3's mixtures of experts (Qwen3-30B-A3B, Qwen3-Coder): the experts stacked, as
# mlx-lm's SwitchGLU holds them.
_QWEN3_MOE_BLOCK_TENSORS = {
    **{k: v for k, v in _BLOCK_TENSORS.items() if k not in _DENSE_MLP},
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
    "ffn_up_exps": "mlp.switch_mlp.up_proj",
    "ffn_down_exps": "mlp.switch_mlp.down_proj",
}


# gpt-oss's: attention with biases and sinks (a whole tail: llama.cpp names them .weight), then
# a mixture of experts with biases, as mlx-lm's gpt_oss sanitize leaves them.
_GPT_OSS_BLOCK_TENSORS = {
    **{k: v for k, v in _BLOCK_TENSORS.items() if k not in (*_DENSE_MLP, "ffn_norm")},
    "post_attention_norm": "post_attention_layernorm",
    "attn_sinks.weight": "self_attn.sinks",
    "ffn_gate_inp": "mlp.router",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}


# Qwen3.5's layers: Gated DeltaNet (linear_attn) or gated attention, each then an MLP.
# The last two map whole tails: ssm_a has no suffix, and ssm_dt.bias is dt_bias.
_QWEN35_BLOCK_TENSORS = {
    **{k: v for k, v in _BLOCK_TENSORS.items() if k != "ffn_norm"},
    "post_attention_norm": "post_attention_layernorm",
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
    "ssm_a": "linear_attn.A_log",
    "ssm_dt.bias": "linear_attn.dt_bias",
}


# Qwen3.5's mixtures of experts: the experts stacked, as mlx-lm's SwitchGLU holds them.
_QWEN35_MOE_BLOCK_TENSORS = {
    **{k: v for k, v in _QWEN35_BLOCK_TENSORS.items() if not k.startswith("ffn_")},
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
    "ffn_up_exps": "mlp.switch_mlp.up_proj",
    "ffn_down_exps": "mlp.switch_mlp.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}


# Qwen3-Next's: in_proj_ba whole, and in_proj_qkvz whole in older files (ssm_in) or, in
# newer ones, as Qwen3.5's in_proj_qkv and in_proj_z, joined back (.hybrid).
_QWEN3_NEXT_BLOCK_TENSORS = {
    **{k: v for k, v in _QWEN35_MOE_BLOCK_TENSORS.items() if k not in ("ssm_beta", "ssm_alpha")},
    "ssm_ba": "linear_attn.in_proj_ba",
    "ssm_in": "linear_attn.in_proj_qkvz",
}


# GLM-4.5 / 4.6 / 4.7's layers (the dense first ones, then mixtures of experts), and the
# next-n layer past them, filed as DeepSeek-V3 files it (``model.layers.{n}``).
_GLM4_MOE_BLOCK_TENSORS = {
    **{k: v for k, v in _BLOCK_TENSORS.items() if k != "ffn_norm"},
    "post_attention_norm": "post_attention_layernorm",
    "ffn_gate_inp": "mlp.gate",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
    "ffn_up_exps": "mlp.switch_mlp.up_proj",
    "ffn_down_exps": "mlp.switch_mlp.down_proj",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
    "nextn.eh_proj": "eh_proj",
    "nextn.enorm": "enorm",
    "nextn.hnorm": "hnorm",
    "nextn.shared_head_norm": "shared_head.norm",
}
# DeepSeek-V3's and GLM-4.7-Flash's (llama.cpp's deepseek2): multi-head latent attention,
# its kv_b_proj whole in older files, else split as mlx-lm's sanitize splits it (k_b_proj
# transposed is embed_q, v_b_proj unembed_out); then mixtures of experts as GLM-4.5's.
_DEEPSEEK2_BLOCK_TENSORS = {
    **{
        k: v
        for k, v in _GLM4_MOE_BLOCK_TENSORS.items()
        if k not in ("attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "post_attention_norm")
    },
    "ffn_norm": "post_attention_layernorm",
    "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",
    "attn_k_b": "self_attn.embed_q",
    "attn_v_b": "self_attn.unembed_out",
}
# What a next-n layer repeats of the model (its embedding and output), left out.
_NEXT_N_REPEATED = ("nextn.embed_tokens.weight", "nextn.shared_head_head.weight")


# Norm weights llama.cpp may store shifted: every RMSNorm's, the MTP head's input norms
# among them, but for the Gated DeltaNet's gated norm (Qwen3NextModel.modify_tensors).
_NORM_SUFFIXES = ("norm.weight", "norm_embedding.weight", "norm_hidden.weight")


@dataclass(frozen=True, slots=True)
class _Arch:
    model_type: str
    hf_class: str
    blocks: Mapping[str, str]
    permute_qk: bool  # llama.cpp reorders Q/K rows of llama-architecture files
    norm_shift: float  # subtracted from norm weights that llama.cpp stores shifted
    default_rope_theta: float
    hybrid: str | None = None  # the Gated DeltaNet family, "qwen3_5" or "qwen3_next" (.hybrid)
    next_n: bool = False  # MTP layers filed as the model's next layers (DeepSeek-V3's way)
    short_conv: bool = False  # LFM2's short convolutions among attention (.short_conv)
    mamba2: bool = False  # Mamba2 layers, or Mamba's (.mamba2)
    top: Mapping[str, str] | None = None  # the tensors outside the layers, where not _TOP_TENSORS
    stack: str = "model.layers"  # where the layers' tensors are filed


_ARCHS = {
    "llama": _Arch("llama", "LlamaForCausalLM", _BLOCK_TENSORS, True, 0.0, 10_000.0),
    "qwen2": _Arch("qwen2", "Qwen2ForCausalLM", _BLOCK_TENSORS, False, 0.0, 1_000_000.0),
    "qwen3": _Arch("qwen3", "Qwen3ForCausalLM", _BLOCK_TENSORS, False, 0.0, 1_000_000.0),
    "qwen3moe": _Arch(
        "qwen3_moe", "Qwen3MoeForCausalLM", _QWEN3_MOE_BLOCK_TENSORS, False, 0.0, 1_000_000.0
    ),
    # Rope rotates halves (llama.cpp's NEOX kind): no Q/K rows were reordered.
    "gpt-oss": _Arch("gpt_oss", "GptOssForCausalLM", _GPT_OSS_BLOCK_TENSORS, False, 0.0, 150_000.0),
    # Gemma's RMSNorm multiplies by 1 + w; llama.cpp stores 1 + w to multiply by it.
    "gemma3": _Arch(
        "gemma3_text", "Gemma3ForCausalLM", _GEMMA_BLOCK_TENSORS, False, 1.0, 1_000_000.0
    ),
    # Qwen3.5's RMSNorms multiply by 1 + w as Gemma's do; llama.cpp stores 1 + w.
    "qwen35": _Arch(
        "qwen3_5",
        "Qwen3_5ForCausalLM",
        _QWEN35_BLOCK_TENSORS,
        False,
        1.0,
        10_000_000.0,
        hybrid="qwen3_5",
    ),
    "qwen35moe": _Arch(
        "qwen3_5_moe",
        "Qwen3_5MoeForCausalLM",
        _QWEN35_MOE_BLOCK_TENSORS,
        False,
        1.0,
        10_000_000.0,
        hybrid="qwen3_5",
    ),
    "glm4moe": _Arch(
        "glm4_moe",
        "Glm4MoeForCausalLM",
        _GLM4_MOE_BLOCK_TENSORS,
        False,
        0.0,
        1_000_000.0,
        next_n=True,
    ),
    # GLM-4.7-Flash's files are deepseek2 too: its pre-tokenizer tells them apart (_mla_config).
    "deepseek2": _Arch(
        "deepseek_v3",
        "DeepseekV3ForCausalLM",
        _DEEPSEEK2_BLOCK_TENSORS,
        False,
        0.0,
        10_000.0,
        next_n=True,
    ),
    # Written in mlx-lm's layout (see .hybrid), whose norms hold what is applied: llama.cpp's.
    "qwen3next": _Arch(
        "qwen3_next",
        "Qwen3NextForCausalLM",
        _QWEN3_NEXT_BLOCK_TENSORS,
        False,
        0.0,
        10_000_000.0,
        hybrid="qwen3_next",
    ),
    # Granite 3's dense models (and Granite 4's without Mamba2 layers): llama's, with
    # multipliers; Q/K reordered as llama's.
    "granite": _Arch("granite", "GraniteForCausalLM", _BLOCK_TENSORS, True, 0.0, 10_000.0),
    # Granite 3's mixtures of experts: its experts instead of the dense MLP.
    "granitemoe": _Arch(
        "granitemoe",
        "GraniteMoeForCausalLM",
        {
            **{k: v for k, v in _BLOCK_TENSORS.items() if k not in _DENSE_MLP},
            **mamba2.GRANITE_EXPERTS,
        },
        True,
        0.0,
        10_000.0,
    ),
    # Q/K reordered as llama's (GraniteHybridModel.undo_permute).
    "granitehybrid": _Arch(
        "granitemoehybrid",
        "GraniteMoeHybridForCausalLM",
        {**_BLOCK_TENSORS, **mamba2.BLOCK_TENSORS},
        True,
        0.0,
        10_000.0,
        mamba2=True,
    ),
    # Rope rotates halves (llama.cpp's NEOX kind): no Q/K rows were reordered.
    "falcon-h1": _Arch(
        "falcon_h1",
        "FalconH1ForCausalLM",
        mamba2.FALCON_H1_BLOCK_TENSORS,
        False,
        0.0,
        100_000_000_000.0,
        mamba2=True,
        top=mamba2.FALCON_H1_TOP_TENSORS,
    ),
    # Mamba (v1) and Mamba2 alone (Falcon-Mamba, Mamba-Codestral), filed as mlx-lm's
    # classes file them (Mamba2's layers as Nemotron-H's are).
    **{
        name: _Arch(
            name,
            hf_class,
            blocks,
            False,
            0.0,
            10_000.0,
            mamba2=True,
            top=mamba2.NEMOTRON_TOP_TENSORS,
            stack="backbone.layers",
        )
        for name, hf_class, blocks in (
            ("mamba", "MambaForCausalLM", mamba2.MAMBA_BLOCK_TENSORS),
            ("mamba2", "Mamba2ForCausalLM", mamba2.NEMOTRON_BLOCK_TENSORS),
        )
    },
    "lfm2": _Arch(
        "lfm2",
        "Lfm2ForCausalLM",
        short_conv.BLOCK_TENSORS,
        False,
        0.0,
        1_000_000.0,
        short_conv=True,
        top=short_conv.TOP_TENSORS,
    ),
    "lfm2moe": _Arch(
        "lfm2_moe",
        "Lfm2MoeForCausalLM",
        short_conv.MOE_BLOCK_TENSORS,
        False,
        0.0,
        1_000_000.0,
        short_conv=True,
        top=short_conv.TOP_TENSORS,
    ),
    # Q/K reordered as llama's (it converts as GraniteHybridModel does); dense or experts.
    **{
        name: _Arch(
            "nemotron_h",
            "NemotronHForCausalLM",
            mamba2.NEMOTRON_BLOCK_TENSORS,
            True,
            0.0,
            10_000.0,
            mamba2=True,
            top=mamba2.NEMOTRON_TOP_TENSORS,
            stack="backbone.layers",
        )
        for name in ("nemotron_h", "nemotron_h_moe")
    },
}


def _convert(
    gguf_path: Path,
    out: Path,
    name: str,
    q_bits: int | None,
    dtype: str,
    report: Callable[[ImportProgress], None],
    cancel: threading.Event | None,
    mtp_path: Path | None = None,
) -> None:
    label = gguf_path.name
    report(ImportProgress("reading", 0, 1))
    reader = _open(gguf_path)
    meta, arch_name, arch = _header(reader, label)
    tensors = list(reader.tensors)
    _check_tensor_types(tensors, label)
    layers = _own_layers(meta, arch_name, label)
    if only_a_head(tensors, layers):
        raise ModelError(
            f"{label} holds only an MTP head (llama.cpp's --mtp): import it with its model's file"
        )
    if mtp_path is not None:
        tensors += _head_file(mtp_path, arch_name, layers, tensors, label)
    plan, rope_freqs = _plan_tensors(tensors, arch, layers, dtype, label)
    config = _model_config(meta, arch, arch_name, tensors, layers, dtype, rope_freqs, label)
    text = config.get("text_config", config)
    _check_plan(plan, config, label)
    report(ImportProgress("reading", 1, 1))

    _check_cancel(cancel)
    report(ImportProgress("tokenizer", 0, 1))
    tok = _build_tokenizer(meta, arch_name, int(text["max_position_embeddings"]), label)
    if tok.eos_token_id is not None:
        config["eos_token_id"] = tok.eos_token_id
    if tok.bos_token_id is not None:
        config["bos_token_id"] = tok.bos_token_id
    report(ImportProgress("tokenizer", 1, 1))

    float_bytes = sum(p.nbytes for p in plan)
    needed = float_bytes
    if q_bits is not None:
        needed += float_bytes * q_bits // (8 * _DTYPES[dtype]) + float_bytes // 8
    require_space(out.parent, needed, name)

    weights_dir = out if q_bits is None else out / ".unquantized"
    weights_dir.mkdir(exist_ok=True)
    _write_json(weights_dir / "config.json", config)

    def produce(p: _Planned) -> np.ndarray:
        return _dequantized(p, arch, text, dtype, label)

    def written(done: int, total: int) -> None:
        report(ImportProgress("tensors", done, total))
        if done < total:
            _check_cancel(cancel)

    report(ImportProgress("tensors", 0, len(plan)))
    _write_shards(weights_dir, _shard(plan), produce, written)
    del reader, tensors, plan

    if q_bits is not None:
        _check_cancel(cancel)
        config = _quantize(weights_dir, out, config, q_bits, report, cancel)
        shutil.rmtree(weights_dir)
        _write_json(out / "config.json", config)
    (out / "tokenizer.json").write_text(tok.tokenizer_json, encoding="utf-8")
    _write_json(out / "tokenizer_config.json", tok.tokenizer_config)
    _write_json(out / "generation_config.json", tok.generation_config)


def _header(reader: Any, label: str) -> tuple[_Metadata, str, _Arch]:
    """A file's metadata, architecture name and architecture, if Tandem reads it whole."""
    meta = _Metadata(reader, label)
    arch_name = str(meta.require("general.architecture"))
    arch = _ARCHS.get(arch_name)
    if arch is None:
        supported = ", ".join(sorted(_ARCHS))
        raise ModelError(
            f"{label}: architecture '{arch_name}' is not supported (supported: {supported})"
        )
    splits = meta.get("split.count", 1)
    if isinstance(splits, int) and splits > 1:
        raise ModelError(
            f"{label}: one of {splits} split GGUF files; merge them first "
            "(llama-gguf-split --merge)"
        )
    return meta, arch_name, arch


def only_a_head(tensors: Sequence[Any], layers: int) -> bool:
    """Whether a file's tensors are an MTP head alone: blocks past its model's ``layers``
    (and the embeddings and output it repeats), as llama.cpp's ``--mtp`` writes them."""
    return not any(t.name.startswith("blk.0.") for t in tensors) and any(
        t.name.startswith(f"blk.{layers}.") for t in tensors
    )


def holds_only_a_head(path: Path) -> bool:
    """Whether the GGUF file at ``path`` is an MTP head alone (``False`` where it is
    unreadable: importing it says why)."""
    try:
        reader = _open(path)
        meta, arch_name, _arch = _header(reader, path.name)
        return only_a_head(reader.tensors, _own_layers(meta, arch_name, path.name))
    except ModelError:
        return False


def _head_file(
    path: Path, arch_name: str, layers: int, tensors: Sequence[Any], label: str
) -> list[Any]:
    """The MTP layers in ``path``, a file of llama.cpp's ``--mtp`` for the model in ``label``
    (``tensors``, ``layers`` of its own): its blocks past the model's. What it repeats of
    the model (embeddings, final norm, output) is left out, and must be of the model's shapes.

    Raises:
        ModelError: The file is no such head, or another model's, in one line.
    """
    head_label = path.name
    reader = _open(path)
    meta, head_arch, arch = _header(reader, head_label)
    if head_arch != arch_name:
        raise ModelError(f"{head_label} is a {head_arch} file, {label} a {arch_name} one")
    if arch.hybrid != "qwen3_5" and not arch.next_n:
        raise ModelError(
            f"{head_label}: Tandem reads the MTP heads of Qwen3.5 / 3.6, GLM-4.5 / 4.6 / 4.7 and "
            "GLM-4.7-Flash files only"
        )
    own = list(reader.tensors)
    if not only_a_head(own, _own_layers(meta, head_arch, head_label)):
        raise ModelError(f"{head_label} is no MTP head alone (llama.cpp's --mtp writes those)")
    if any(t.name.startswith(f"blk.{layers}.") for t in tensors):
        raise ModelError(f"{label} carries its MTP layers already: import it alone")
    head = [t for t in own if t.name.startswith("blk.")]
    model = {t.name: t for t in tensors}
    past = min(int(t.name.split(".")[1]) for t in head)
    if past != layers:
        raise ModelError(f"{head_label} is the head of a {past}-layer model; {label} has {layers}")
    for t in own:
        if t.name in model and list(t.shape) != list(model[t.name].shape):
            raise ModelError(f"{head_label} belongs to another model: its {t.name} differs")
    _check_tensor_types(head, head_label)
    return head


def _open(path: Path) -> Any:
    import gguf

    try:
        if path.is_file():
            return gguf.GGUFReader(path)
    except OSError as exc:
        raise ModelError(f"{path.name}: {read_error(exc)}") from exc
    except Exception as exc:  # the reader fails in many ways on damaged files
        raise ModelError(
            f"{path.name}: not a readable GGUF file, or truncated ({first_line(exc)})"
        ) from exc
    if path.is_dir():
        raise ModelError(f"{path}: a folder, not a GGUF file")
    if path.is_symlink():
        raise ModelError(f"{path}: a broken or looping symbolic link")
    raise ModelError(f"{path}: no such file")


def _check_tensor_types(tensors: Sequence[Any], label: str) -> None:
    """Fails before any writing on a tensor type gguf's numpy code cannot dequantize."""
    import gguf

    probed: set[Any] = set()
    for t in tensors:
        qtype = t.tensor_type
        if qtype in probed:
            continue
        _block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        # Quantized data comes as bytes, one block of them per row here.
        width = type_size if t.data.dtype == np.uint8 else 1
        try:
            raw = np.zeros((1, width), dtype=t.data.dtype)
            gguf.quants.dequantize(raw, qtype)
        except NotImplementedError as exc:
            raise ModelError(
                f"{label}: tensor type {qtype.name} ({t.name}) is not supported"
            ) from exc
        probed.add(qtype)


def _check_plan(plan: Sequence[_Planned], config: dict[str, Any], label: str) -> None:
    """Fails before any writing unless the tensors are the model's own, each of its shape.

    The model is built lazily and given never-evaluated placeholders of the
    planned shapes, so nothing is allocated however large the model.
    """
    import mlx.core as mx

    check_sizes(config, label, source="the file's metadata")
    model_class, args_class = model_classes(config, label)
    try:
        model = model_class(args_class.from_dict(config))
        weights = {p.name: mx.zeros(p.shape) for p in plan}
        if hasattr(model, "sanitize"):
            weights = model.sanitize(weights)
        model.load_weights(list(weights.items()), strict=True)
        _check_head(model, plan, config)
    except Exception as exc:  # missing, extra or misshapen tensors, or odd metadata
        raise ModelError(
            f"{label}: the tensors do not make a {config['model_type']} model ({one_line(exc)})"
        ) from exc


def _own_layers(meta: _Metadata, arch_name: str, label: str) -> int:
    """The model's own layers: llama.cpp counts MTP layers (nextn) in block_count."""
    p = f"{arch_name}."
    try:
        blocks = _int(meta.require(p + "block_count"))
        layers = blocks - _int(meta.get(p + "nextn_predict_layers", 0))
    except (TypeError, ValueError) as exc:
        raise ModelError(f"{label}: malformed model metadata ({first_line(exc)})") from exc
    if not 0 < layers <= blocks:
        raise ModelError(f"{label}: inconsistent layer metadata")
    return layers


def _plan_tensors(
    tensors: Sequence[Any], arch: _Arch, layers: int, dtype: str, label: str
) -> tuple[list[_Planned], np.ndarray | None]:
    """Maps every tensor to its Hugging Face name; returns llama's rope factors apart."""
    plan: list[_Planned] = []
    rope_freqs: np.ndarray | None = None
    if arch.hybrid == "qwen3_next":
        _refuse_mtp(tensors, label)
    for t in tensors:
        if t.name == "rope_freqs.weight":
            rope_freqs = np.asarray(_dequantize_raw(t, label), dtype=np.float64)
            continue
        # What a next-n layer (or Nemotron-H's folded MTP block) repeats of the model.
        if (arch.next_n or arch.model_type == "nemotron_h") and t.name.endswith(_NEXT_N_REPEATED):
            continue
        name = _hf_name(t.name, arch, layers)
        if name is None:
            raise ModelError(f"{label}: tensor '{t.name}' has no MLX counterpart")
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if arch.hybrid:
            shape = _hf_shape(name, shape, arch.hybrid)
        if arch.short_conv:
            shape = short_conv.conv_shape(name, shape)
        if arch.mamba2:
            shape = mamba2.hf_shape(name, shape)
        kind = _tensor_dtype(name, arch, dtype)
        plan.append(
            _Planned(t, name, shape, _SAFETENSORS_CODES[kind], math.prod(shape) * _DTYPES[kind])
        )
    embed = (arch.top or _TOP_TENSORS)["token_embd.weight"]
    if not any(p.name == embed for p in plan):
        raise ModelError(f"{label}: no token_embd.weight tensor")
    if arch.mamba2:
        plan = mamba2.join_shared(plan)
    return _join_qkvz(plan) if arch.hybrid == "qwen3_next" else plan, rope_freqs


def _hf_name(name: str, arch: _Arch, layers: int) -> str | None:
    top = arch.top or _TOP_TENSORS
    if name in top:
        return top[name]
    parts = name.split(".", 2)
    if len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit():
        return None
    block, tail = int(parts[1]), parts[2]
    if block < layers or arch.next_n:
        module = _block_module(tail, arch)
        return None if module is None else f"{arch.stack}.{block}.{module}"
    if arch.model_type == "nemotron_h":
        return mamba2.nemotron_mtp_name(tail)
    # llama.cpp files Qwen3.5's MTP layer i as block n_layer + i.
    if arch.hybrid != "qwen3_5":
        return None
    return _mtp_name(block - layers, tail, _block_module(tail, arch))


def _block_module(tail: str, arch: _Arch) -> str | None:
    """A block tensor's name within its layer, from its GGUF name past ``blk.N.``."""
    if tail in arch.blocks:
        return arch.blocks[tail]
    short, _, kind = tail.rpartition(".")
    module = arch.blocks.get(short)
    return None if module is None or kind not in ("weight", "bias") else f"{module}.{kind}"


def _model_config(
    meta: _Metadata,
    arch: _Arch,
    arch_name: str,
    tensors: Sequence[Any],
    n_layers: int,
    dtype: str,
    rope_freqs: np.ndarray | None,
    label: str,
) -> dict[str, Any]:
    """The Hugging Face ``config.json`` that mlx-lm's model class for ``arch`` reads."""
    names = {t.name for t in tensors}
    embed = next(t for t in tensors if t.name == "token_embd.weight")
    p = f"{arch_name}."
    common = {
        "architectures": [arch.hf_class],
        "model_type": arch.model_type,
        # Rows, not the token count: embeddings are often padded past the vocabulary.
        "vocab_size": int(embed.shape[1]),
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": dtype,
    }
    alone = {"mamba2": mamba2.alone_config, "mamba": mamba2.mamba_config}.get(arch.model_type)
    if alone is not None:  # no attention to read
        try:
            return _named(meta, {**common, **alone(meta, p, names, n_layers)})
        except (TypeError, ValueError) as exc:
            raise ModelError(f"{label}: malformed model metadata ({first_line(exc)})") from exc
    try:
        hidden = _int(meta.require(p + "embedding_length"))
        n_heads = _int(meta.require(p + "attention.head_count"))
        n_kv_heads, kv_heads = _heads_kv(meta, p, n_heads)
        head_dim = _int(meta.get(p + "attention.key_length", hidden // n_heads))
        context = _int(meta.get(p + "context_length", 4096))
        theta = _f32(meta.get(p + "rope.freq_base", arch.default_rope_theta))
        config: dict[str, Any] = {
            **common,
            "hidden_size": hidden,
            **_sizes(meta, p, arch),
            "num_hidden_layers": n_layers,
            "num_attention_heads": n_heads,
            "num_key_value_heads": n_kv_heads,
            "head_dim": head_dim,
            "rms_norm_eps": _f32(meta.get(p + "attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": theta,
            "max_position_embeddings": context,
        }
        rope_scaling = _rope_scaling(meta, p, rope_freqs, head_dim, theta, label)
        if arch.hybrid:
            config.update(_hybrid_config(meta, p, arch.hybrid, head_dim, theta, rope_scaling))
            if mtp := _mtp_layers(tensors, n_layers):
                config["mtp_num_hidden_layers"] = mtp
        if arch.short_conv:
            config.update(short_conv.config(meta, p, kv_heads, names))
        if arch.model_type == "granitemoehybrid":
            config.update(mamba2.config(meta, p, kv_heads, names))
        if arch.model_type == "falcon_h1":
            config.update(mamba2.falcon_h1_config(meta, p, names))
        if arch.model_type == "nemotron_h":
            config.update(mamba2.nemotron_config(meta, p, kv_heads, names, n_layers))
            if mtp := _mtp_layers(tensors, n_layers):
                if mtp > 1:
                    raise ValueError("more than one MTP block (llama.cpp folds one)")
                config["num_nextn_predict_layers"] = mtp
                config["mtp_hybrid_override_pattern"] = mamba2.NEMOTRON_MTP_PATTERN
    except (TypeError, ValueError) as exc:
        raise ModelError(f"{label}: malformed model metadata ({first_line(exc)})") from exc
    if n_heads <= 0 or n_kv_heads <= 0 or n_heads % n_kv_heads or head_dim % 2:
        raise ModelError(f"{label}: inconsistent attention metadata")
    if rope_scaling is not None and arch.hybrid != "qwen3_5":  # kept in rope_parameters
        config["rope_scaling"] = rope_scaling
    if arch.model_type in ("llama", "qwen2"):
        config["hidden_act"] = "silu"
    if arch.model_type == "qwen3_moe":
        config.update(_qwen3_moe_layers(meta, p))
    if arch.model_type == "gpt_oss":
        config.update(_gpt_oss_layers(meta, p, n_layers, rope_scaling))
    # Any layer's: a hybrid's first may have no attention or MLP.
    if arch.model_type in _ATTENTION_BIAS:
        config["attention_bias"] = any(n.endswith(".attn_q.bias") for n in names)
    if arch.model_type in _MLP_BIAS:
        config["mlp_bias"] = any(n.endswith(".ffn_up.bias") for n in names)
    if arch.model_type in ("granite", "granitemoe"):
        config.update(_granite_multipliers(meta, p))
    if arch.next_n:
        config["rope_scaling"] = rope_scaling  # their configs name it, none or not
        if mtp := _mtp_layers(tensors, n_layers):
            config["num_nextn_predict_layers"] = mtp
    if arch.model_type == "glm4_moe":
        rotary = _int(meta.get(p + "rope.dimension_count", head_dim))
        config["partial_rotary_factor"] = rotary / head_dim
        config["use_qk_norm"] = "blk.0.attn_q_norm.weight" in names
    if arch.model_type == "deepseek_v3":
        config.update(_mla_config(meta, p, n_heads, rope_scaling, label))
        del config["head_dim"]  # a latent attention's: the sizes below
    if arch.model_type == "gemma3_text":
        pattern = meta.get(p + "attention.sliding_window_pattern")
        config.update(
            {
                "sliding_window": _int(meta.get(p + "attention.sliding_window", 512)),
                # llama.cpp fixes these for Gemma 3 unless the file says otherwise.
                "sliding_window_pattern": pattern if isinstance(pattern, int) else 6,
                "rope_local_base_freq": _f32(meta.get(p + "rope.freq_base_swa", 10_000.0)),
                # Gemma 3 27B (62 layers) scales queries by hidden / heads, the rest by head_dim.
                "query_pre_attn_scalar": hidden // n_heads if n_layers == 62 else head_dim,
                "hidden_activation": "gelu_pytorch_tanh",
            }
        )
    config = _named(meta, config)
    return _nested(config) if arch.hybrid == "qwen3_5" else config


def _named(meta: _Metadata, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the model's name, where the file has one."""
    name = meta.get("general.name")
    if isinstance(name, str) and name:
        config["_name_or_path"] = name
    return config


def _sizes(meta: _Metadata, prefix: str, arch: _Arch) -> dict[str, Any]:
    """The feed-forward widths as ``arch``'s config names them."""
    if arch.next_n:
        return _glm_sizes(meta, prefix)
    if arch.short_conv:
        return short_conv.sizes(meta, prefix)
    if arch.model_type == "nemotron_h":  # a width a layer: with .mamba2
        return {}
    if arch.model_type == "gpt_oss":  # GptOssModel's: its experts' count and width
        width = meta.get(prefix + "expert_feed_forward_length")
        return {
            "num_local_experts": _int(meta.require(prefix + "expert_count")),
            "num_experts_per_tok": _int(meta.require(prefix + "expert_used_count")),
            "intermediate_size": _int(width or meta.require(prefix + "feed_forward_length")),
        }
    if arch.model_type == "granitemoe":  # GraniteMoeModel's: the experts' width, no shared one
        width = _int(meta.require(prefix + "feed_forward_length"))
        return {"intermediate_size": width, **_granite_experts(meta, prefix, required=True)}
    if arch.mamba2:  # the experts' width; their count and the shared one's with .mamba2
        return {"intermediate_size": _int(meta.require(prefix + "feed_forward_length"))}
    return _mlp_sizes(meta, prefix)


def _mlp_sizes(meta: _Metadata, prefix: str) -> dict[str, Any]:
    """The MLP's width, or a mixture of experts' sizes (the keys Qwen2MoeModel writes);
    a mixture may leave out the dense width it never uses."""
    experts = meta.get(prefix + "expert_count")
    if not experts:
        return {"intermediate_size": _int(meta.require(prefix + "feed_forward_length"))}
    sizes = {
        "num_experts": _int(experts),
        "num_experts_per_tok": _int(meta.require(prefix + "expert_used_count")),
        "moe_intermediate_size": _int(meta.require(prefix + "expert_feed_forward_length")),
    }
    # Qwen2MoeModel writes it for a shared expert only (Qwen3's mixtures have none).
    if (shared := meta.get(prefix + "expert_shared_feed_forward_length")) is not None:
        sizes["shared_expert_intermediate_size"] = _int(shared)
    if (width := meta.get(prefix + "feed_forward_length")) is not None:
        sizes["intermediate_size"] = _int(width)
    return sizes


def _qwen3_moe_layers(meta: _Metadata, prefix: str) -> dict[str, Any]:
    """A Qwen3 mixture's routing: every layer's (llama.cpp's qwen3moe has no dense one), the
    chosen experts' weights renormalized (llama.cpp: always, unless the file says)."""
    return {
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": bool(meta.get(prefix + "expert_weights_norm", True)),
    }


def _gpt_oss_layers(
    meta: _Metadata, prefix: str, layers: int, rope_scaling: dict[str, Any] | None
) -> dict[str, Any]:
    """gpt-oss's sliding window, in every other layer from the first (llama.cpp sets that
    pattern, its files do not), and its yarn rope with llama.cpp's betas unless named."""
    config: dict[str, Any] = {
        "sliding_window": _int(meta.require(prefix + "attention.sliding_window")),
        "layer_types": [("sliding_attention", "full_attention")[i % 2] for i in range(layers)],
    }
    if rope_scaling is not None and rope_scaling["rope_type"] == "yarn":
        config["rope_scaling"] = {
            **rope_scaling,
            "beta_fast": _f32(meta.get(prefix + "rope.scaling.yarn_beta_fast", 32.0)),
            "beta_slow": _f32(meta.get(prefix + "rope.scaling.yarn_beta_slow", 1.0)),
        }
    return config


def _glm_sizes(meta: _Metadata, prefix: str) -> dict[str, Any]:
    """GLM-4.5's and DeepSeek-V3's dense width and mixture of experts (the keys their configs
    name), from what Glm4MoeModel and DeepseekV2Model write; routing groups are one unless
    the file says otherwise."""
    return {
        "intermediate_size": _int(meta.require(prefix + "feed_forward_length")),
        "n_routed_experts": _int(meta.require(prefix + "expert_count")),
        "num_experts_per_tok": _int(meta.require(prefix + "expert_used_count")),
        "moe_intermediate_size": _int(meta.require(prefix + "expert_feed_forward_length")),
        "n_shared_experts": _int(meta.get(prefix + "expert_shared_count", 0)),
        "first_k_dense_replace": _int(meta.get(prefix + "leading_dense_block_count", 0)),
        "routed_scaling_factor": _f32(meta.get(prefix + "expert_weights_scale", 1.0)),
        "norm_topk_prob": bool(meta.get(prefix + "expert_weights_norm", False)),
        "n_group": _int(meta.get(prefix + "expert_group_count", 1)),
        "topk_group": _int(meta.get(prefix + "expert_group_used_count", 1)),
    }


def _mla_config(
    meta: _Metadata, prefix: str, n_heads: int, rope_scaling: dict[str, Any] | None, label: str
) -> dict[str, Any]:
    """A deepseek2 file's latent attention (DeepseekV2Model's keys; files before
    key_length_mla keep its sizes in key_length and value_length), and which model it is.

    Raises:
        ModelError: DeepSeek-V2's softmax routing, which mlx-lm's deepseek_v3 has not.
    """
    if meta.get(prefix + "expert_gating_func") != _SIGMOID:
        raise ModelError(f"{label}: DeepSeek-V2's routing is not supported (V3's and GLM's are)")
    rope = _int(meta.require(prefix + "rope.dimension_count"))
    key = meta.get(prefix + "attention.key_length_mla", meta.get(prefix + "attention.key_length"))
    value = meta.get(
        prefix + "attention.value_length_mla", meta.get(prefix + "attention.value_length")
    )
    q_rank = meta.get(prefix + "attention.q_lora_rank")
    config: dict[str, Any] = {
        "num_key_value_heads": n_heads,  # the file's one is the latent's (MQA)
        "kv_lora_rank": _int(meta.require(prefix + "attention.kv_lora_rank")),
        "q_lora_rank": None if q_rank is None else _int(q_rank),
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": _int(key) - rope,
        "v_head_dim": _int(value),
    }
    if rope_scaling is not None and rope_scaling["rope_type"] == "yarn":
        # DeepseekV2Model keeps 0.1 * mscale_all_dim; DeepSeek's configs set mscale alike.
        mscale = _f32(meta.get(prefix + "rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
        yarn = {"mscale": mscale, "mscale_all_dim": mscale, "beta_fast": 32, "beta_slow": 1}
        config["rope_scaling"] = {**rope_scaling, **yarn}
    if meta.get("tokenizer.ggml.pre") == "glm4":  # GLM-4.7-Flash, converted as DeepSeek-V3
        config.update({"model_type": "glm4_moe_lite", "architectures": ["Glm4MoeLiteForCausalLM"]})
    return config


def _rope_scaling(
    meta: _Metadata,
    prefix: str,
    rope_freqs: np.ndarray | None,
    head_dim: int,
    theta: float,
    label: str,
) -> dict[str, Any] | None:
    if rope_freqs is not None:
        return _llama3_rope_scaling(rope_freqs, head_dim, theta, label)
    kind = meta.get(prefix + "rope.scaling.type")
    factor = meta.get(prefix + "rope.scaling.factor")
    if kind in (None, "none") or not factor or float(factor) == 1.0:
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": _f32(factor)}
    if kind == "yarn":
        original = meta.get(prefix + "rope.scaling.original_context_length")
        if original is None:
            raise ModelError(f"{label}: yarn rope scaling without its original context length")
        return {
            "rope_type": "yarn",
            "factor": _f32(factor),
            "original_max_position_embeddings": _int(original),
        }
    raise ModelError(f"{label}: rope scaling '{kind}' is not supported")


def _llama3_rope_scaling(
    factors: np.ndarray, head_dim: int, theta: float, label: str
) -> dict[str, Any] | None:
    """Recovers Llama 3.1's rope scaling from the per-frequency factors llama.cpp stores."""
    factors = factors.reshape(-1)
    if factors.size != head_dim // 2:
        raise ModelError(f"{label}: rope_freqs has {factors.size} entries, not {head_dim // 2}")
    if np.allclose(factors, 1.0):
        return None
    factor = float(factors.max())
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / inv_freq
    for low, high, original in _LLAMA3_ROPE_CANDIDATES:
        smooth = (original / wavelen - low) / (high - low)
        expected = np.where(
            wavelen < original / high,
            1.0,
            np.where(wavelen > original / low, factor, 1 / ((1 - smooth) / factor + smooth)),
        )
        if np.allclose(expected, factors, rtol=1e-3):
            return {
                "rope_type": "llama3",
                "factor": float(f"{factor:.6g}"),
                "low_freq_factor": low,
                "high_freq_factor": high,
                "original_max_position_embeddings": original,
            }
    raise ModelError(f"{label}: the rope scaling in rope_freqs is not one Tandem recognizes")


def _dequantized(
    p: _Planned, arch: _Arch, text: Mapping[str, Any], dtype: str, label: str
) -> np.ndarray:
    """One tensor as float32 in the Hugging Face layout, cast to ``dtype``.

    ``text`` is the config, or its ``text_config`` where it has one.
    """
    if isinstance(p.source, _Joined):  # Qwen3-Next's in_proj_qkvz, Granite's input_linear
        parts = [_dequantize_raw(s, label) for s in p.source.parts]
        if arch.hybrid == "qwen3_next":
            x = _qkvz(parts, p.shape, text, label)
        else:  # rows one part after the other
            x = np.concatenate([part.reshape(-1, *p.shape[1:]) for part in parts])
    else:
        x = _dequantize_raw(p.source, label).reshape(p.shape)
    if arch.permute_qk and p.name.endswith((".q_proj.weight", ".q_proj.bias")):
        x = _unpermute_qk(x, int(text["num_attention_heads"]))
    elif arch.permute_qk and p.name.endswith((".k_proj.weight", ".k_proj.bias")):
        x = _unpermute_qk(x, int(text["num_key_value_heads"]))
    if arch.hybrid:
        x = _undo_linear_attention(p.name, x, text, label, arch.hybrid)
    if arch.mamba2:
        x = mamba2.undo(p.name, x, label)
    if arch.norm_shift and _is_shifted_norm(p.name):
        x = x - np.float32(arch.norm_shift)
    return _cast(x, _tensor_dtype(p.name, arch, dtype))


def _tensor_dtype(name: str, arch: _Arch, dtype: str) -> str:
    """A tensor's type: Gated DeltaNet's A_log stays float32, as mlx-lm's qwen3_5
    conversions keep it (its cast_predicate); Qwen3-Next's too, for the same precision."""
    return "float32" if arch.hybrid and name.endswith(".A_log") else dtype


def _is_shifted_norm(name: str) -> bool:
    return name.endswith(_NORM_SUFFIXES) and not name.endswith(".linear_attn.norm.weight")


def _dequantize_raw(t: Any, label: str) -> np.ndarray:
    import gguf

    try:
        x = gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError as exc:
        raise ModelError(f"{label}: tensor type {t.tensor_type.name} is not supported") from exc
    except (ValueError, OSError) as exc:
        raise ModelError(f"{label}: tensor {t.name} is unreadable ({first_line(exc)})") from exc
    return np.asarray(x, dtype=np.float32)


def _unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undoes llama.cpp's rotary reordering of Q or K rows (``permute`` in convert_hf_to_gguf).

    llama.cpp rotates pairs of adjacent dimensions; Hugging Face models rotate
    the two halves of each head. The converter interleaved the halves, so here
    each head's rows go from (head_dim/2, 2) back to (2, head_dim/2).
    """
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ModelError(f"a Q/K tensor of {rows} rows does not split into {n_head} heads")
    return np.ascontiguousarray(
        w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _cast(x: np.ndarray, dtype: str) -> np.ndarray:
    """Bytes-ready array of ``x`` in ``dtype`` (bfloat16 as its raw uint16 bits)."""
    if dtype == "float32":
        return np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "float16":
        return np.ascontiguousarray(x.astype(np.float16))
    import mlx.core as mx

    return np.asarray(mx.array(x).astype(mx.bfloat16).view(mx.uint16))
