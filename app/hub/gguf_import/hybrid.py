"""Gated DeltaNet among attention: Qwen3.5 / 3.6 (llama.cpp's qwen35, qwen35moe; with MTP
layers) and Qwen3-Next (qwen3next).

llama.cpp's converter (``convert_hf_to_gguf.py``: ``Qwen3NextModel``,
``_LinearAttentionVReorderBase`` and ``_Qwen35MtpMixin``) edits these tensors on
the way in; the helpers here undo it, so that the folder holds what a Hugging
Face checkpoint holds, which mlx-lm's ``qwen3_5`` class and Tandem's MTP head
load:

- ``A_log`` became ``ssm_a = -exp(A_log)``, ``dt_bias`` became ``ssm_dt.bias``;
- the depthwise convolution lost its middle axis of 1: (channels, kernel);
- every RMSNorm weight but the Gated DeltaNet's gated one became 1 + w (undone in
  :mod:`.convert`, as Gemma's);
- with more value heads than key heads, the value heads went from grouped by key
  head to tiled across the key heads: in the value rows of ``in_proj_qkv`` and of
  the convolution, in ``in_proj_z``, ``in_proj_b``, ``in_proj_a``, ``A_log`` and
  ``dt_bias``, and in ``out_proj``'s columns;
- MTP layer i became block n_layer + i, and the head's ``fc`` and norms became
  ``nextn.*`` tensors of the first of those blocks.

Qwen3-Next's files (``Qwen3NextModel`` itself: the first three edits, no value-head
tiling, MTP layers dropped) become mlx-lm's own layout instead, what its
``qwen3_next`` class holds after ``sanitize``: that ``sanitize`` stacks the experts,
shifts the norms and turns the convolution only for a checkpoint with one tensor per
expert, so a folder of stacked experts must hold the norms and convolution done:

- norms stay llama.cpp's 1 + w, which mlx-lm multiplies by; the convolution is
  MLX's (channels, kernel, 1);
- ``in_proj_qkvz``, its rows grouped by key head ([q, k, v, z] per head), was split
  into ``attn_qkv`` (all q, all k, all v) and ``attn_gate`` (all z), joined back
  here; older files hold it whole, as ``ssm_in``. ``in_proj_ba`` stays whole (``ssm_ba``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.errors import ModelError
from app.hub.gguf_import.common import _int, _join, _Metadata, _Planned

# The MTP head's own tensors, filed under its first block.
_NEXTN_TENSORS = {
    "nextn.eh_proj.weight": "fc.weight",
    "nextn.enorm.weight": "pre_fc_norm_embedding.weight",
    "nextn.hnorm.weight": "pre_fc_norm_hidden.weight",
    "nextn.shared_head_norm.weight": "norm.weight",
}

# Qwen3-Next's mixture as llama.cpp runs it, whatever the file says: experts in every layer
# (its loader requires them) and the chosen experts' weights normalized (build_moe_ffn's
# norm_w, always true in its qwen3next graph).
_QWEN3_NEXT_MOE = {"decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True}

# in_proj_qkvz's parts, as llama.cpp's converter split it.
_QKV = ".linear_attn.in_proj_qkv.weight"
_Z = ".linear_attn.in_proj_z.weight"


# What a Qwen3.5 config keeps at its top level, beside the text model's settings.
_TOP_KEYS = (
    "architectures",
    "model_type",
    "vocab_size",
    "tie_word_embeddings",
    "torch_dtype",
    "_name_or_path",
)


def _mtp_name(index: int, tail: str, module: str | None) -> str | None:
    """The Hugging Face name of ``blk.{n_layer + index}.{tail}``, ``module`` being the
    tail's name in a decoder layer."""
    if index == 0 and tail in _NEXTN_TENSORS:
        return f"mtp.{_NEXTN_TENSORS[tail]}"
    return None if module is None else f"mtp.layers.{index}.{module}"


def _hybrid_config(
    meta: _Metadata,
    prefix: str,
    family: str,
    head_dim: int,
    theta: float,
    rope_scaling: dict[str, Any] | None,
) -> dict[str, Any]:
    """The Gated DeltaNet and rope settings, from the keys ``Qwen3NextModel`` writes;
    ``family`` is ``"qwen3_5"`` or ``"qwen3_next"``.

    Raises:
        ValueError: A value is malformed.
    """
    v_heads = _int(meta.require(prefix + "ssm.time_step_rank"))
    inner = _int(meta.require(prefix + "ssm.inner_size"))
    if v_heads <= 0 or inner % v_heads:
        raise ValueError("ssm.inner_size does not split into ssm.time_step_rank heads")
    if head_dim <= 0:
        raise ValueError(f"a head size of {head_dim}")
    # Both rotate a quarter of each head unless the file says otherwise.
    rope_dims = _int(meta.get(prefix + "rope.dimension_count", head_dim // 4))
    linear = {
        "linear_conv_kernel_dim": _int(meta.require(prefix + "ssm.conv_kernel")),
        "linear_key_head_dim": _int(meta.require(prefix + "ssm.state_size")),
        "linear_num_key_heads": _int(meta.require(prefix + "ssm.group_count")),
        "linear_num_value_heads": v_heads,
        "linear_value_head_dim": inner // v_heads,
        "full_attention_interval": _int(meta.get(prefix + "full_attention_interval", 4)),
    }
    if family == "qwen3_next":
        return {**linear, **_QWEN3_NEXT_MOE, "partial_rotary_factor": rope_dims / head_dim}
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": theta,
        "partial_rotary_factor": rope_dims / head_dim,
    }
    sections = meta.get(prefix + "rope.dimension_sections")
    if isinstance(sections, list):
        rope["mrope_section"] = [_int(s) for s in sections[:3]]  # llama.cpp pads [t, h, w]
    # mlx-lm's qwen3_5 takes its rope from here, whatever the other keys say.
    return {**linear, "rope_parameters": {**rope, **(rope_scaling or {})}}


def _mtp_layers(tensors: Sequence[Any], layers: int) -> int:
    """The MTP layers among ``tensors`` (llama.cpp's blocks past the model's ``layers``; 0
    where they were left out), whichever file they came from."""
    blocks = {t.name.split(".")[1] for t in tensors if t.name.startswith("blk.")}
    return sum(1 for b in blocks if b.isdigit() and int(b) >= layers)


def _nested(config: dict[str, Any]) -> dict[str, Any]:
    """Qwen3.5's layout, as its Hugging Face checkpoints have it: the text model's
    settings under ``text_config``."""
    own = ("architectures", "torch_dtype", "_name_or_path")
    text = {k: v for k, v in config.items() if k not in own}
    text["model_type"] = f"{config['model_type']}_text"
    return {**{k: config[k] for k in _TOP_KEYS if k in config}, "text_config": text}


def _hf_shape(name: str, shape: tuple[int, ...], family: str) -> tuple[int, ...]:
    """A tensor's shape in the folder: a convolution gets back the axis llama.cpp squeezed,
    where Hugging Face has it or, for Qwen3-Next, where MLX has it."""
    if name.endswith(".linear_attn.conv1d.weight") and len(shape) == 2:
        return (*shape, 1) if family == "qwen3_next" else (shape[0], 1, shape[1])
    return shape


def _refuse_mtp(tensors: Sequence[Any], label: str) -> None:
    """Qwen3-Next's MTP layers: llama.cpp's converter drops them, and Tandem has no head
    for them."""
    if any(".nextn." in t.name for t in tensors):
        raise ModelError(f"{label}: Qwen3-Next MTP layers (nextn tensors) are not supported")


def _join_qkvz(plan: Sequence[_Planned]) -> list[_Planned]:
    """Each layer's ``in_proj_qkv`` and ``in_proj_z`` (llama.cpp's ``attn_qkv`` and
    ``attn_gate``) planned as the one ``in_proj_qkvz`` mlx-lm's qwen3_next loads, read
    from both (:func:`_qkvz`)."""
    return _join(plan, _QKV, _Z, ".linear_attn.in_proj_qkvz.weight")


def _qkvz(
    parts: Sequence[np.ndarray], shape: tuple[int, ...], text: Mapping[str, Any], label: str
) -> np.ndarray:
    """``in_proj_qkvz`` from its parts (all q, all k, all v; then all z): rows grouped by
    key head again, [q, k, v, z] each, undoing ``Qwen3NextModel.modify_tensors``.

    Raises:
        ModelError: The parts' rows are not the config's q, k and v, and z (their sum
            alone passes the model's check).
    """
    k_heads = int(text["linear_num_key_heads"])
    k_rows = k_heads * int(text["linear_key_head_dim"])
    v_rows = int(text["linear_num_value_heads"]) * int(text["linear_value_head_dim"])
    rows = [len(part) for part in parts]
    if rows != [2 * k_rows + v_rows, v_rows]:
        raise ModelError(f"{label}: attn_qkv and attn_gate hold {rows} rows, not the config's")
    x = np.concatenate([part.reshape(-1) for part in parts]).reshape(shape)
    q, k, v, z = np.split(x, [k_rows, 2 * k_rows, 2 * k_rows + v_rows])
    by_head = [t.reshape(k_heads, -1, *shape[1:]) for t in (q, k, v, z)]
    return np.concatenate(by_head, axis=1).reshape(shape)


def _undo_linear_attention(
    name: str, x: np.ndarray, text: Mapping[str, Any], label: str, family: str
) -> np.ndarray:
    """A Gated DeltaNet tensor (``*.linear_attn.*``) freed of llama.cpp's edits."""
    if ".linear_attn." not in name:
        return x
    own = name.rpartition(".linear_attn.")[2]
    if own == "A_log":
        x = _a_log(x, name, label)
    if family == "qwen3_next":  # Qwen3NextModel leaves the value heads in their order
        return x
    k_heads, v_heads = int(text["linear_num_key_heads"]), int(text["linear_num_value_heads"])
    layout = _value_heads(own, text)
    if layout is None or k_heads == v_heads:
        return x
    axis, size, start = layout
    return _ungroup(x, axis, start, k_heads, v_heads // k_heads, size)


def _a_log(ssm_a: np.ndarray, name: str, label: str) -> np.ndarray:
    """``A_log`` back from llama.cpp's ``ssm_a = -exp(A_log)``."""
    if not np.all(ssm_a < 0):
        raise ModelError(f"{label}: {name} (ssm_a) holds values that are not negative")
    a_log: np.ndarray = np.log(-ssm_a)
    return a_log


def _value_heads(own: str, text: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """Where a Gated DeltaNet tensor holds its value heads: the axis, each head's size
    there, and the rows of q and k that come first."""
    v_dim = int(text["linear_value_head_dim"])
    qk = 2 * int(text["linear_key_head_dim"]) * int(text["linear_num_key_heads"])
    layouts = {
        "in_proj_qkv.weight": (0, v_dim, qk),
        "conv1d.weight": (0, v_dim, qk),
        "in_proj_z.weight": (0, v_dim, 0),
        "out_proj.weight": (1, v_dim, 0),
        "in_proj_b.weight": (0, 1, 0),
        "in_proj_a.weight": (0, 1, 0),
        "A_log": (0, 1, 0),
        "dt_bias": (0, 1, 0),
    }
    return layouts.get(own)


def _ungroup(
    x: np.ndarray, axis: int, start: int, k_heads: int, per_k: int, size: int
) -> np.ndarray:
    """Undoes ``_reorder_v_heads``: the value heads past ``start`` along ``axis`` go from
    llama.cpp's tiled order (the first of every key head's, then the second, ...) back
    to Hugging Face's, grouped by key head."""
    kept, heads = np.split(x, [start], axis=axis)
    shape = heads.shape
    tiled = heads.reshape((*shape[:axis], per_k, k_heads, size, *shape[axis + 1 :]))
    grouped = np.swapaxes(tiled, axis, axis + 1).reshape(shape)
    return np.concatenate([kept, grouped], axis=axis)


def _check_head(model: Any, plan: Sequence[_Planned], config: dict[str, Any]) -> None:
    """Loads placeholders of the planned MTP tensors into the head Tandem builds: mlx-lm
    drops them at load, so the model's own check never sees them.

    Raises:
        ValueError: Missing, extra or misshapen MTP tensors.
    """
    import mlx.core as mx

    from app.engine.mtp import head_name, head_of

    head = [(name, mx.zeros(p.shape)) for p in plan if (name := head_name(p.name, config))]
    if head:
        head_of(model, config).load_weights(head, strict=True)
