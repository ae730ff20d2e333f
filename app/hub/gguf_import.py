"""Importing models into Tandem's folder: GGUF files converted to MLX, and MLX folders.

A GGUF file (llama.cpp's format) holds the weights, often quantized, plus the
config and tokenizer as metadata. :func:`import_gguf` dequantizes every tensor
with the ``gguf`` package's numpy code, renames it to the Hugging Face layout
that mlx-lm loads, undoes llama.cpp's own weight edits, rebuilds
``tokenizer.json`` from the metadata and optionally re-quantizes with MLX.

Both importers write into a hidden sibling folder and rename it into place at
the end, so a failed, cancelled or crashed import never leaves a half-written
model where the library would find it.
"""

from __future__ import annotations

import errno
import json
import math
import os
import secrets
import shutil
import struct
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.loader import (
    ModelError,
    check_sizes,
    check_weights,
    first_line,
    model_classes,
    one_line,
    read_config,
    read_error,
    user_path,
)
from app.hub.library import require_space

# Shards stay below 2 GB so every filesystem and the Hub's tooling accept them.
_SHARD_BYTES = 2_000_000_000
_GROUP_SIZE = 64
_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}
_SAFETENSORS_CODES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}

# llama.cpp token types (tokenizer.ggml.token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
# Control tokens that end a turn although the metadata may name only one eos id.
_END_OF_TURN = frozenset({"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>"})

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre values (llama.cpp's names) whose split regex is known. Anything
# else falls back to GPT-2's regex, which most byte-level vocabularies started from.
_PRE_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT,
    "pixtral": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "megrez": _QWEN2_SPLIT,
}
# llama.cpp matches a whole pre-token against the vocabulary before merging for these.
_IGNORE_MERGES = frozenset(
    {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe"}
)
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


class ImportCancelled(Exception):  # noqa: N818 - a cancel, not an error
    """The import was cancelled; nothing was left behind."""


@dataclass(frozen=True, slots=True)
class ImportProgress:
    """How far an import has come.

    Attributes:
        stage: ``"reading"``, ``"tokenizer"``, ``"tensors"``, ``"quantizing"`` or ``"writing"``.
        done: Steps of the stage finished.
        total: Steps of the stage.
    """

    stage: str
    done: int
    total: int


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


@dataclass(frozen=True, slots=True)
class _Planned:
    """One output tensor: where it comes from and what it becomes."""

    source: Any  # gguf.ReaderTensor, or None for tensors of the quantized model
    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype code
    nbytes: int


@dataclass(frozen=True, slots=True)
class _TokenizerFiles:
    tokenizer_json: str
    tokenizer_config: dict[str, Any]
    generation_config: dict[str, Any]
    eos_token_id: int | list[int] | None
    bos_token_id: int | None


def import_gguf(
    gguf_path: Path,
    out_dir: Path,
    *,
    q_bits: int | None = None,
    dtype: str = "float32",
    progress: Callable[[ImportProgress], None] | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Converts a GGUF file into an MLX model folder in the Hugging Face layout.

    Args:
        gguf_path: The ``.gguf`` file; split files must be merged first.
        out_dir: The model folder to create; must not exist yet.
        q_bits: 4 or 8 to re-quantize with MLX (group size 64); ``None`` keeps
            the dequantized weights.
        dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"``: the weights'
            type, and the type of the scales of a quantized model.
        progress: Called on the calling thread as the import advances.
        cancel: Checked between tensors; once set the import stops.

    Returns:
        ``out_dir``.

    Raises:
        ModelError: The file cannot be imported or written, with a one-line reason.
        ImportCancelled: ``cancel`` was set; nothing was left behind.
        ValueError: ``q_bits`` or ``dtype`` is not one of the values above.
    """
    if q_bits not in (None, 4, 8):
        raise ValueError(f"q_bits must be None, 4 or 8, not {q_bits!r}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, not {dtype!r}")
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    _refuse_existing(out_dir)
    report = progress or (lambda _p: None)
    with _partial_folder(out_dir) as partial:
        _convert(gguf_path, partial, out_dir.name, q_bits, dtype, report, cancel)
        _check_cancel(cancel)
        report(ImportProgress("writing", 0, 1))
        _move_into_place(partial, out_dir)
        report(ImportProgress("writing", 1, 1))
    return out_dir


def import_folder(src: Path, models_dir: Path, *, link: bool = False) -> Path:
    """Imports an existing MLX model folder into ``models_dir`` under its own name.

    Args:
        src: The model folder; validated with :func:`read_config` and
            :func:`check_weights` first.
        models_dir: Tandem's model folder.
        link: Symlink to ``src`` instead of copying it (the folder must then stay put).

    Returns:
        The new folder (or link) in ``models_dir``.

    Raises:
        ModelError: ``src`` is not a usable model folder, the name is taken, or
            the copy failed, with a one-line reason.
    """
    src = Path(os.path.abspath(user_path(src)))
    check_weights(src, read_config(src))
    target = Path(models_dir) / src.name
    _refuse_existing(target)
    if link:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(src.resolve(), target_is_directory=True)
        except OSError as exc:
            raise _write_error(exc, target) from exc
        return target
    with _partial_folder(target) as partial:
        require_space(target.parent, _tree_size(src), src.name)
        partial.rmdir()  # copytree creates the folder itself
        # Follow file links: a Hub cache snapshot links to blobs that must be copied.
        shutil.copytree(src, partial, ignore=_linked_folders, ignore_dangling_symlinks=True)
        _move_into_place(partial, target)
    return target


# --- conversion ---------------------------------------------------------------


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


class _Metadata:
    """The GGUF key/value metadata, read on demand."""

    def __init__(self, reader: Any, label: str) -> None:
        self._fields = reader.fields
        self._label = label

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except (UnicodeDecodeError, ValueError, IndexError) as exc:
            raise ModelError(f"{self._label}: metadata {key} is unreadable") from exc

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelError(f"{self._label}: metadata {key} is missing")
        return value


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


# --- re-quantization ------------------------------------------------------------


def _quantize(
    weights_dir: Path,
    out: Path,
    config: dict[str, Any],
    q_bits: int,
    report: Callable[[ImportProgress], None],
    cancel: threading.Event | None,
) -> dict[str, Any]:
    """Quantizes the model in ``weights_dir`` with mlx-lm and writes it into ``out``."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model, quantize_model

    try:
        # Lazy: each weight is read from disk only when its quantized form is written.
        model, loaded = load_model(weights_dir, lazy=True)
        model, quantized = quantize_model(model, loaded, group_size=_GROUP_SIZE, bits=q_bits)
    except Exception as exc:  # mlx-lm raises many kinds for a config it cannot build
        raise ModelError(f"cannot quantize the model ({first_line(exc)})") from exc
    params: dict[str, Any] = dict(tree_flatten(model.parameters()))
    del model
    plan = [
        _Planned(None, name, tuple(a.shape), _mx_code(a.dtype), int(a.nbytes))
        for name, a in params.items()
    ]

    def produce(p: _Planned) -> np.ndarray:
        a = params.pop(p.name)
        mx.eval(a)
        if a.dtype == mx.bfloat16:
            a = a.view(mx.uint16)
        return np.asarray(a)

    def written(done: int, total: int) -> None:
        report(ImportProgress("quantizing", done, total))
        if done < total:
            _check_cancel(cancel)

    report(ImportProgress("quantizing", 0, len(plan)))
    _write_shards(out, _shard(plan), produce, written)
    config = dict(config)
    config["quantization"] = quantized["quantization"]
    config["quantization_config"] = quantized["quantization"]
    return config


def _mx_code(dtype: Any) -> str:
    import mlx.core as mx

    codes = {
        mx.float32: "F32",
        mx.float16: "F16",
        mx.bfloat16: "BF16",
        mx.uint32: "U32",
        mx.uint8: "U8",
        mx.int32: "I32",
    }
    if dtype not in codes:
        raise ModelError(f"cannot save a weight of type {dtype}")
    return codes[dtype]


# --- safetensors writing ------------------------------------------------------------


def _shard(plan: Sequence[_Planned]) -> list[list[_Planned]]:
    """Groups tensors into shards of at most ``_SHARD_BYTES`` (a larger tensor gets its own)."""
    shards: list[list[_Planned]] = []
    size = 0
    for p in plan:
        if not shards or (shards[-1] and size + p.nbytes > _SHARD_BYTES):
            shards.append([])
            size = 0
        shards[-1].append(p)
        size += p.nbytes
    return shards


def _write_shards(
    folder: Path,
    shards: Sequence[Sequence[_Planned]],
    produce: Callable[[_Planned], np.ndarray],
    written: Callable[[int, int], None],
) -> None:
    """Streams tensors into safetensors files, one tensor in memory at a time.

    The shapes are known up front, so each file's header is written first and
    every tensor's bytes follow as soon as ``produce`` returns them.
    """
    total = sum(len(s) for s in shards)
    done = 0
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        file_name = (
            "model.safetensors"
            if len(shards) == 1
            else f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        )
        header: dict[str, Any] = {"__metadata__": {"format": "mlx"}}
        offset = 0
        for p in shard:
            header[p.name] = {
                "dtype": p.dtype,
                "shape": list(p.shape),
                "data_offsets": [offset, offset + p.nbytes],
            }
            offset += p.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)  # keeps the data 8-byte aligned
        with (folder / file_name).open("wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for p in shard:
                data = np.ascontiguousarray(produce(p))
                if data.nbytes != p.nbytes:
                    raise ModelError(f"tensor {p.name} has {data.nbytes} bytes, not {p.nbytes}")
                f.write(data.reshape(-1).view(np.uint8).data)
                del data
                weight_map[p.name] = file_name
                done += 1
                written(done, total)
    if len(shards) > 1:
        total_size = sum(p.nbytes for s in shards for p in s)
        index = {
            "metadata": {"total_size": total_size},
            "weight_map": dict(sorted(weight_map.items())),
        }
        _write_json(folder / "model.safetensors.index.json", index)


# --- tokenizer ---------------------------------------------------------------------


def _build_tokenizer(meta: _Metadata, arch_name: str, context: int, label: str) -> _TokenizerFiles:
    """``tokenizer.json`` and its companions, rebuilt from the ``tokenizer.ggml.*`` metadata."""
    from tokenizers import AddedToken, Tokenizer, processors

    kind = meta.get("tokenizer.ggml.model")
    if kind is None:
        raise ModelError(f"{label}: no tokenizer in the file (tokenizer.ggml.model is missing)")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelError(f"{label}: no tokenizer in the file (tokenizer.ggml.tokens is missing)")
    types = meta.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise ModelError(f"{label}: tokenizer.ggml.token_type does not match the tokens")

    tokenizer: Tokenizer
    if kind == "gpt2":
        merges = meta.get("tokenizer.ggml.merges")
        if not merges:
            raise ModelError(f"{label}: tokenizer.ggml.merges is missing")
        pre = meta.get("tokenizer.ggml.pre")
        tokenizer = _byte_level_bpe(tokens, types, merges, pre if isinstance(pre, str) else None)
        add_bos_default = False
    elif kind == "llama":
        scores = meta.get("tokenizer.ggml.scores")
        if scores is None or len(scores) != len(tokens):
            raise ModelError(f"{label}: tokenizer.ggml.scores is missing")
        add_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        gemma = arch_name.startswith("gemma")
        tokenizer = _sentencepiece_bpe(tokens, types, scores, gemma=gemma, add_prefix=add_prefix)
        add_bos_default = True
    else:
        raise ModelError(f"{label}: tokenizer type '{kind}' is not supported yet")

    # Control tokens become special added tokens, user-defined ones plain added tokens,
    # so that both are matched whole in text. Only tokens the model's vocabulary holds
    # under the same id are added: anything else would get a new id past the embeddings.
    special: list[AddedToken] = []
    user: list[AddedToken] = []
    for i, (t, ty) in enumerate(zip(tokens, types, strict=True)):
        if ty in (_CONTROL, _USER_DEFINED) and t and tokenizer.token_to_id(t) == i:
            is_special = ty == _CONTROL
            (special if is_special else user).append(
                AddedToken(t, lstrip=False, rstrip=False, normalized=False, special=is_special)
            )
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(user)

    def token_at(key: str) -> tuple[int | None, str | None]:
        value = meta.get(key)
        if not isinstance(value, int) or not 0 <= value < len(tokens):
            return None, None
        return value, tokens[value]

    bos_id, bos = token_at("tokenizer.ggml.bos_token_id")
    eos_id, eos = token_at("tokenizer.ggml.eos_token_id")
    pad_id, pad = token_at("tokenizer.ggml.padding_token_id")
    _unk_id, unk = token_at("tokenizer.ggml.unknown_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)) and bos is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        single = " ".join([f"{bos}:0"] * add_bos + ["$A:0"] + [f"{eos}:0"] * add_eos)
        pair = single + " " + " ".join([f"{bos}:1"] * add_bos + ["$B:1"] + [f"{eos}:1"] * add_eos)
        specials = []
        if add_bos:
            specials.append((bos, bos_id))
        if add_eos and eos != bos:
            specials.append((eos, eos_id))
        tokenizer.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=specials
        )

    eos_ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        token_id, _ = token_at(f"tokenizer.ggml.{key}")
        if token_id is not None and token_id not in eos_ids:
            eos_ids.append(token_id)
    for i, (t, ty) in enumerate(zip(tokens, types, strict=True)):
        if ty == _CONTROL and t in _END_OF_TURN and i not in eos_ids:
            eos_ids.append(i)
    eos_value: int | list[int] | None = (
        None if not eos_ids else eos_ids[0] if len(eos_ids) == 1 else eos_ids
    )

    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "unk_token": unk,
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "model_max_length": context,
        "clean_up_tokenization_spaces": False,
    }
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        tokenizer_config["chat_template"] = template
    generation = {
        k: v
        for k, v in (
            ("bos_token_id", bos_id),
            ("eos_token_id", eos_value),
            ("pad_token_id", pad_id),
        )
        if v is not None
    }
    return _TokenizerFiles(
        tokenizer_json=tokenizer.to_str(pretty=True),
        tokenizer_config=tokenizer_config,
        generation_config=generation,
        eos_token_id=eos_value,
        bos_token_id=bos_id,
    )


def _vocab(tokens: Sequence[str], types: Sequence[int]) -> dict[str, int]:
    """Token → id; a repeated token keeps its first id, as llama.cpp does.

    llama.cpp's converter fills embedding rows past the tokenizer with unused
    ``[PAD<id>]`` tokens; they are left out so that the vocabulary equals the
    original tokenizer's and pairs with models taken from the Hub.
    """
    vocab: dict[str, int] = {}
    for i, (t, ty) in enumerate(zip(tokens, types, strict=True)):
        if not (ty == _UNUSED and t == f"[PAD{i}]"):
            vocab.setdefault(t, i)
    return vocab


def _byte_level_bpe(
    tokens: Sequence[str], types: Sequence[int], merges: Sequence[str], pre: str | None
) -> Any:
    """GPT-2 style byte-level BPE, split the way the vocabulary's merges were learned."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if sep:
            pairs.append((left, right))
    tokenizer = Tokenizer(
        models.BPE(
            vocab=_vocab(tokens, types),
            merges=pairs,
            dropout=None,
            unk_token=None,
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=pre in _IGNORE_MERGES,
        )
    )
    split = _PRE_SPLITS.get(pre or "")
    if pre == "smollm":
        # SmolLM splits off every digit, then applies GPT-2's regex.
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    elif split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece_bpe(
    tokens: Sequence[str],
    types: Sequence[int],
    scores: Sequence[float],
    *,
    gemma: bool,
    add_prefix: bool,
) -> Any:
    """A SentencePiece BPE vocabulary as a ``tokenizers`` BPE with byte fallback.

    The file has scores but no merges; the merges are rebuilt from the
    vocabulary, best-scored result first, as transformers does.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    if gemma:
        # Gemma files spell runs of spaces as real spaces, and rank merges by file order.
        tokens = ["\u2581" * len(t) if t and not t.strip(" ") else t for t in tokens]
        ranks: Sequence[float] = [-float(i) for i in range(len(tokens))]
    else:
        ranks = [float(s) for s in scores]
    vocab = _vocab(tokens, types)
    unk = next((t for t, ty in zip(tokens, types, strict=True) if ty == _UNKNOWN), None)
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=_spm_merges(tokens, types, ranks),
            dropout=None,
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    else:
        scheme = "first" if add_prefix else "never"
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="\u2581", prepend_scheme=scheme, split=False
        )
        if add_prefix:
            steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def _spm_merges(
    tokens: Sequence[str], types: Sequence[int], ranks: Sequence[float]
) -> list[tuple[str, str]]:
    """Every split of a text token into two text tokens, best-ranked result first.

    Text tokens are the normal and user-defined ones (Gemma's runs of spaces are
    user-defined and are reached by merging); control and byte tokens never
    come out of merging.
    """
    normal: dict[str, int] = {}
    for i, (t, ty) in enumerate(zip(tokens, types, strict=True)):
        if ty in (_NORMAL, _USER_DEFINED):
            normal.setdefault(t, i)
    found: list[tuple[float, int, int, int, int, str, str]] = []
    for token, token_id in normal.items():
        rank = ranks[token_id]
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            left_id, right_id = normal.get(left), normal.get(right)
            if left_id is not None and right_id is not None:
                found.append((-rank, -len(left), -len(right), left_id, right_id, left, right))
    found.sort()
    return [(f[5], f[6]) for f in found]


# --- files and folders ------------------------------------------------------------


def _refuse_existing(target: Path) -> None:
    if target.exists() or target.is_symlink():
        raise ModelError(f"{target.name} already exists in {target.parent}")


@contextmanager
def _partial_folder(target: Path) -> Iterator[Path]:
    """A hidden sibling of ``target`` to write into; removed unless renamed into place.

    Also turns write errors into :class:`ModelError` with a one-line reason.
    """
    path = target.parent / f".{target.name}.partial-{secrets.token_hex(4)}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
        yield path
    except OSError as exc:
        raise _write_error(exc, target) from exc
    finally:
        if path.exists() or path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _linked_folders(folder: str, names: list[str]) -> set[str]:
    """Links to folders, which a copy skips: one that points up the tree would never end."""
    paths = {name: os.path.join(folder, name) for name in names}
    return {name for name, p in paths.items() if os.path.islink(p) and os.path.isdir(p)}


def _write_error(exc: OSError, target: Path) -> ModelError:
    if exc.errno == errno.ENOSPC:
        return ModelError(f"not enough disk space to write {target.name} in {target.parent}")
    return ModelError(f"cannot write {target.name} ({first_line(exc)})")


def _move_into_place(partial: Path, target: Path) -> None:
    # rename() would replace an empty folder that appeared meanwhile; refuse instead.
    _refuse_existing(target)
    os.rename(partial, target)


def _tree_size(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for file in files:
            try:
                total += os.stat(os.path.join(root, file)).st_size
            except OSError:
                continue
    return total


def _write_json(file: Path, data: Any) -> None:
    file.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise ImportCancelled("import cancelled")


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
