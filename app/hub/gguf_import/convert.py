"""Conversion: GGUF tensors and metadata to an MLX model in the Hugging Face layout.

Each tensor is dequantized with the ``gguf`` package's numpy code, renamed to
the names mlx-lm loads and freed of llama.cpp's own edits (permuted Q/K rows,
shifted norms); ``config.json`` is rebuilt from the metadata.
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
from app.hub.gguf_import.common import (
    _DTYPES,
    _SAFETENSORS_CODES,
    ImportProgress,
    _check_cancel,
    _Metadata,
    _Planned,
)
from app.hub.gguf_import.files import _write_json
from app.hub.gguf_import.quantize import _quantize
from app.hub.gguf_import.shards import _shard, _write_shards
from app.hub.gguf_import.tokenizer import _build_tokenizer
from app.hub.library import require_space

# Llama 3.1+ rope scaling (low_freq_factor, high_freq_factor, original context):
# GGUF keeps only the resulting per-frequency factors, so these are tried against them.
_LLAMA3_ROPE_CANDIDATES = ((1.0, 4.0, 8192),)


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


# Gemma normalizes around both sublayers; its ffn_norm is the pre-feed-forward norm.
_GEMMA_BLOCK_TENSORS = {
    **_BLOCK_TENSORS,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


@dataclass(frozen=True, slots=True)
class _Arch:
    model_type: str
    hf_class: str
    blocks: Mapping[str, str]
    permute_qk: bool  # llama.cpp reorders Q/K rows of llama-architecture files
    norm_shift: float  # subtracted from norm weights that llama.cpp stores shifted
    default_rope_theta: float


_ARCHS = {
    "llama": _Arch("llama", "LlamaForCausalLM", _BLOCK_TENSORS, True, 0.0, 10_000.0),
    "qwen2": _Arch("qwen2", "Qwen2ForCausalLM", _BLOCK_TENSORS, False, 0.0, 1_000_000.0),
    "qwen3": _Arch("qwen3", "Qwen3ForCausalLM", _BLOCK_TENSORS, False, 0.0, 1_000_000.0),
    # Gemma's RMSNorm multiplies by 1 + w; llama.cpp stores 1 + w to multiply by it.
    "gemma3": _Arch(
        "gemma3_text", "Gemma3ForCausalLM", _GEMMA_BLOCK_TENSORS, False, 1.0, 1_000_000.0
    ),
}


def _convert(
    gguf_path: Path,
    out: Path,
    name: str,
    q_bits: int | None,
    dtype: str,
    report: Callable[[ImportProgress], None],
    cancel: threading.Event | None,
) -> None:
    label = gguf_path.name
    report(ImportProgress("reading", 0, 1))
    reader = _open(gguf_path)
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
    tensors = list(reader.tensors)
    _check_tensor_types(tensors, label)
    plan, rope_freqs = _plan_tensors(tensors, arch, dtype, label)
    config = _model_config(meta, arch, arch_name, tensors, dtype, rope_freqs, label)
    _check_plan(plan, config, label)
    report(ImportProgress("reading", 1, 1))

    _check_cancel(cancel)
    report(ImportProgress("tokenizer", 0, 1))
    tok = _build_tokenizer(meta, arch_name, int(config["max_position_embeddings"]), label)
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
    n_heads = int(config["num_attention_heads"])
    n_kv_heads = int(config["num_key_value_heads"])

    def produce(p: _Planned) -> np.ndarray:
        return _dequantized(p, arch, n_heads, n_kv_heads, dtype, label)

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
    except Exception as exc:  # missing, extra or misshapen tensors, or odd metadata
        raise ModelError(
            f"{label}: the tensors do not make a {config['model_type']} model ({one_line(exc)})"
        ) from exc


def _plan_tensors(
    tensors: Sequence[Any], arch: _Arch, dtype: str, label: str
) -> tuple[list[_Planned], np.ndarray | None]:
    """Maps every tensor to its Hugging Face name; returns llama's rope factors apart."""
    plan: list[_Planned] = []
    rope_freqs: np.ndarray | None = None
    itemsize = _DTYPES[dtype]
    for t in tensors:
        if t.name == "rope_freqs.weight":
            rope_freqs = np.asarray(_dequantize_raw(t, label), dtype=np.float64)
            continue
        name = _hf_name(t.name, arch)
        if name is None:
            raise ModelError(f"{label}: tensor '{t.name}' has no MLX counterpart")
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        plan.append(
            _Planned(t, name, shape, _SAFETENSORS_CODES[dtype], math.prod(shape) * itemsize)
        )
    if not any(p.name == "model.embed_tokens.weight" for p in plan):
        raise ModelError(f"{label}: no token_embd.weight tensor")
    return plan, rope_freqs


def _hf_name(name: str, arch: _Arch) -> str | None:
    if name in _TOP_TENSORS:
        return _TOP_TENSORS[name]
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or not parts[1].isdigit():
        return None
    module = arch.blocks.get(parts[2])
    if module is None or parts[3] not in ("weight", "bias"):
        return None
    return f"model.layers.{parts[1]}.{module}.{parts[3]}"


def _model_config(
    meta: _Metadata,
    arch: _Arch,
    arch_name: str,
    tensors: Sequence[Any],
    dtype: str,
    rope_freqs: np.ndarray | None,
    label: str,
) -> dict[str, Any]:
    """The Hugging Face ``config.json`` that mlx-lm's model class for ``arch`` reads."""
    names = {t.name for t in tensors}
    embed = next(t for t in tensors if t.name == "token_embd.weight")
    p = f"{arch_name}."
    try:
        hidden = _int(meta.require(p + "embedding_length"))
        n_heads = _int(meta.require(p + "attention.head_count"))
        n_kv_heads = _int(meta.get(p + "attention.head_count_kv", n_heads))
        head_dim = _int(meta.get(p + "attention.key_length", hidden // n_heads))
        n_layers = _int(meta.require(p + "block_count"))
        context = _int(meta.get(p + "context_length", 4096))
        theta = _f32(meta.get(p + "rope.freq_base", arch.default_rope_theta))
        config: dict[str, Any] = {
            "architectures": [arch.hf_class],
            "model_type": arch.model_type,
            "hidden_size": hidden,
            "intermediate_size": _int(meta.require(p + "feed_forward_length")),
            "num_hidden_layers": n_layers,
            "num_attention_heads": n_heads,
            "num_key_value_heads": n_kv_heads,
            "head_dim": head_dim,
            "rms_norm_eps": _f32(meta.get(p + "attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": theta,
            "max_position_embeddings": context,
            # Rows, not the token count: embeddings are often padded past the vocabulary.
            "vocab_size": int(embed.shape[1]),
            "tie_word_embeddings": "output.weight" not in names,
            "torch_dtype": dtype,
        }
        rope_scaling = _rope_scaling(meta, p, rope_freqs, head_dim, theta, label)
    except (TypeError, ValueError) as exc:
        raise ModelError(f"{label}: malformed model metadata ({first_line(exc)})") from exc
    if n_heads <= 0 or n_kv_heads <= 0 or n_heads % n_kv_heads or head_dim % 2:
        raise ModelError(f"{label}: inconsistent attention metadata")
    if rope_scaling is not None:
        config["rope_scaling"] = rope_scaling
    if arch.model_type in ("llama", "qwen2"):
        config["hidden_act"] = "silu"
    if arch.model_type == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in names
        config["mlp_bias"] = "blk.0.ffn_up.bias" in names
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
    name = meta.get("general.name")
    if isinstance(name, str) and name:
        config["_name_or_path"] = name
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
    p: _Planned, arch: _Arch, n_heads: int, n_kv_heads: int, dtype: str, label: str
) -> np.ndarray:
    """One tensor as float32 in the Hugging Face layout, cast to ``dtype``."""
    x = _dequantize_raw(p.source, label).reshape(p.shape)
    if arch.permute_qk and ".self_attn.q_proj." in p.name:
        x = _unpermute_qk(x, n_heads)
    elif arch.permute_qk and ".self_attn.k_proj." in p.name:
        x = _unpermute_qk(x, n_kv_heads)
    if arch.norm_shift and p.name.endswith("norm.weight"):
        x = x - np.float32(arch.norm_shift)
    return _cast(x, dtype)


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


def _int(value: Any) -> int:
    if isinstance(value, list):
        # Per-layer values (some architectures vary them); these models keep them equal.
        if not value or any(v != value[0] for v in value):
            raise ValueError("per-layer values differ")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ValueError(f"expected an integer, got {value!r}")
    return int(value)


def _f32(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that reads back the same."""
    return float(str(np.float32(value)))
