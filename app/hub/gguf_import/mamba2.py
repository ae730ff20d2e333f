"""Mamba2 layers among attention: Granite 4, Falcon-H1 and Nemotron-H (llama.cpp's
granitehybrid, falcon-h1, nemotron_h and nemotron_h_moe), and alone (mamba2); and Mamba
(v1) layers alone (mamba: Falcon-Mamba, state-spaces' Mamba).

llama.cpp's converter (``Mamba2Model`` and ``GraniteHybridModel``) edits the
Mamba2 layers' tensors on the way in; the helpers here undo it, so that the
folder holds what a Hugging Face checkpoint holds, which mlx-lm's
``granitemoehybrid`` and ``nemotron_h`` classes load:

- ``A_log`` became ``ssm_a = -exp(A_log)``, an axis of 1 added; ``D`` (``ssm_d``)
  got that axis too, and ``dt_bias`` became ``ssm_dt.bias``;
- the depthwise convolution lost its middle axis of 1: (channels, kernel);
- the gated norm's weight went into groups: (n_group, d_inner / n_group);
- the shared expert's ``input_linear`` was split into gate and up rows (joined
  back here), and the attention layers' Q/K rows were reordered as llama's
  (undone with them);
- each layer's key-value head count is listed, 0 for a Mamba2 layer; the
  multipliers became ``attention.scale``, ``embedding_scale``,
  ``residual_scale`` and ``logit_scale``; a model without rope (Granite 4's
  hybrids) says so in ``rope.scaling.finetuned``.

Nemotron-H's layers are one mixer each (Mamba2, attention, an MLP or a mixture of
experts): its file lists each layer's key-value heads and feed-forward width, 0
where the layer has none, which tell the four kinds apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.errors import ModelError
from app.hub.gguf_import.common import (
    _f32,
    _granite_experts,
    _granite_multipliers,
    _int,
    _join,
    _Metadata,
    _Planned,
)

# Granite's mixtures of experts (Granite 3's and 4's), stacked as mlx-lm's SwitchGLU holds them.
GRANITE_EXPERTS = {
    "ffn_gate_inp": "block_sparse_moe.router.layer",
    "ffn_gate_exps": "block_sparse_moe.switch_mlp.gate_proj",
    "ffn_up_exps": "block_sparse_moe.switch_mlp.up_proj",
    "ffn_down_exps": "block_sparse_moe.switch_mlp.down_proj",
}

# Granite 4's Mamba2 layers and mixtures of experts; the shared expert's gate and up rows
# are planned apart, then joined (:func:`join_shared`).
BLOCK_TENSORS = {
    "ssm_in": "mamba.in_proj",
    "ssm_conv1d": "mamba.conv1d",
    "ssm_dt.bias": "mamba.dt_bias",
    "ssm_a": "mamba.A_log",
    "ssm_d": "mamba.D",
    "ssm_norm": "mamba.norm",
    "ssm_out": "mamba.out_proj",
    **GRANITE_EXPERTS,
    "ffn_gate_shexp": "shared_mlp.gate",
    "ffn_up_shexp": "shared_mlp.up",
    "ffn_down_shexp": "shared_mlp.output_linear",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

# Falcon-H1's layers: attention and Mamba2 side by side, then an MLP. llama.cpp folds its
# multipliers into the weights (FalconH1Model.modify_tensors), as mlx-lm's sanitize does.
FALCON_H1_TOP_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.final_layernorm.weight",
    "output.weight": "lm_head.weight",
}
FALCON_H1_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "pre_ff_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    **{k: v for k, v in BLOCK_TENSORS.items() if k.startswith("ssm")},
    "ffn_gate": "feed_forward.gate_proj",
    "ffn_up": "feed_forward.up_proj",
    "ffn_down": "feed_forward.down_proj",
}

# Mamba (v1) layers (MambaModel): dt_proj whole, its weight and bias, and x_proj.
MAMBA_BLOCK_TENSORS = {
    "attn_norm": "norm",
    "ssm_in": "mixer.in_proj",
    "ssm_conv1d": "mixer.conv1d",
    "ssm_x": "mixer.x_proj",
    "ssm_dt": "mixer.dt_proj",
    "ssm_a": "mixer.A_log",
    "ssm_d": "mixer.D",
    "ssm_out": "mixer.out_proj",
}

NEMOTRON_TOP_TENSORS = {
    "token_embd.weight": "backbone.embeddings.weight",
    "output_norm.weight": "backbone.norm_f.weight",
    "output.weight": "lm_head.weight",
}

NEMOTRON_BLOCK_TENSORS = {
    "attn_norm": "norm",
    **{k: v.replace("mamba.", "mixer.") for k, v in BLOCK_TENSORS.items() if k.startswith("ssm")},
    "attn_q": "mixer.q_proj",
    "attn_k": "mixer.k_proj",
    "attn_v": "mixer.v_proj",
    "attn_output": "mixer.o_proj",
    "ffn_up": "mixer.up_proj",
    "ffn_down": "mixer.down_proj",
    "ffn_gate_inp": "mixer.gate",
    "exp_probs_b.bias": "mixer.gate.e_score_correction_bias",
    "ffn_up_exps": "mixer.switch_mlp.fc1",
    "ffn_down_exps": "mixer.switch_mlp.fc2",
    "ffn_up_shexp": "mixer.shared_experts.up_proj",
    "ffn_down_shexp": "mixer.shared_experts.down_proj",
    # Nemotron 3 Super's experts read a narrower latent of the hidden state.
    "ffn_latent_down": "mixer.fc1_latent_proj",
    "ffn_latent_up": "mixer.fc2_latent_proj",
}

_GATE, _UP = ".shared_mlp.gate.weight", ".shared_mlp.up.weight"
_MIXERS = (".mamba.", ".mixer.")  # Granite's and Nemotron-H's Mamba2 modules


def _owns(name: str, *tails: str) -> bool:
    return any(name.endswith(m + t) for m in _MIXERS for t in tails)


def hf_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A Mamba2 (or Mamba) tensor's shape in the checkpoint, from the one llama.cpp wrote.
    Mamba2's A and D got an axis of 1; Mamba's A is (channels, state) as it was."""
    if _owns(name, "conv1d.weight") and len(shape) == 2:
        return (shape[0], 1, shape[1])
    if _owns(name, "A_log", "D") and len(shape) == 2 and shape[1] == 1:
        return (shape[0],)
    if _owns(name, "norm.weight") and len(shape) == 2:
        return (shape[0] * shape[1],)
    return shape


def undo(name: str, x: np.ndarray, label: str) -> np.ndarray:
    """``A_log`` back from llama.cpp's ``-exp(A_log)``; every other tensor as it is."""
    if not _owns(name, "A_log"):
        return x
    if np.any(x >= 0):
        raise ModelError(f"{label}: {name} holds values that are not -exp of anything")
    return np.asarray(np.log(-x), dtype=np.float32)


# Nemotron-H's MTP head as llama.cpp folds it into one block past the layers: its attention
# block (mtp.layers.0) and its mixture of experts (mtp.layers.1), the only kind it converts.
NEMOTRON_MTP_PATTERN = "*E"
_NEMOTRON_MTP_OWN = {
    "nextn.eh_proj": "layers.0.eh_proj",
    "nextn.enorm": "layers.0.enorm",
    "nextn.hnorm": "layers.0.hnorm",
    "attn_norm": "layers.0.norm",
    "ffn_norm": "layers.1.norm",
    "nextn.shared_head_norm": "layers.1.final_layernorm",
}
_ATTENTION = ("mixer.q_proj", "mixer.k_proj", "mixer.v_proj", "mixer.o_proj")


def nemotron_mtp_name(tail: str) -> str | None:
    """Where a tensor of Nemotron-H's folded MTP block (``tail``, past ``blk.N.``) is filed
    in the checkpoint: ``mtp.layers.0`` (attention) or ``mtp.layers.1`` (experts)."""
    short, _, kind = tail.rpartition(".")
    if short in _NEMOTRON_MTP_OWN:
        return f"mtp.{_NEMOTRON_MTP_OWN[short]}.{kind}"
    if tail in NEMOTRON_BLOCK_TENSORS:
        module, kind = NEMOTRON_BLOCK_TENSORS[tail], ""
    elif short in NEMOTRON_BLOCK_TENSORS:
        module, kind = NEMOTRON_BLOCK_TENSORS[short], f".{kind}"
    else:
        return None
    block = 0 if module.startswith(_ATTENTION) else 1
    return f"mtp.layers.{block}.{module}{kind}"


def join_shared(plan: Sequence[_Planned]) -> list[_Planned]:
    """Each layer's shared expert gate and up rows planned as the one ``input_linear``
    mlx-lm's class loads, gate rows first."""
    return _join(plan, _GATE, _UP, ".shared_mlp.input_linear.weight")


@dataclass(frozen=True, slots=True)
class _Ssm:
    """The Mamba2 layers' sizes, as Mamba2Model writes them (each family names them its way)."""

    heads: int
    head_dim: int
    expand: int  # channels over the width: the checkpoints' configs check heads x head = this
    state: int
    conv: int
    groups: int
    in_bias: bool
    conv_bias: bool


def _ssm(meta: _Metadata, prefix: str, names: set[str], widths: bool = True) -> _Ssm:
    """The sizes; ``widths``: the channels a whole number of widths (all but Falcon-H1's,
    whose config names its channels and no ``expand``)."""
    heads = _int(meta.require(prefix + "ssm.time_step_rank"))
    inner = _int(meta.require(prefix + "ssm.inner_size"))
    hidden = _int(meta.require(prefix + "embedding_length"))
    if heads <= 0 or inner % heads or (widths and inner % hidden):
        raise ValueError(f"{inner} Mamba2 channels do not split into {heads} heads, width {hidden}")
    return _Ssm(
        heads,
        inner // heads,
        inner // hidden,
        _int(meta.require(prefix + "ssm.state_size")),
        _int(meta.require(prefix + "ssm.conv_kernel")),
        _int(meta.get(prefix + "ssm.group_count", 1)),
        any(n.endswith(".ssm_in.bias") for n in names),
        any(n.endswith(".ssm_conv1d.bias") for n in names),
    )


def config(
    meta: _Metadata, prefix: str, kv_heads: Sequence[int] | None, names: set[str]
) -> dict[str, Any]:
    """What Granite 4's config adds to the common keys: its layers' kinds (from each
    layer's key-value heads, 0 for Mamba2), the Mamba2 sizes, the multipliers, the
    experts and whether attention uses rope."""
    if kv_heads is None:
        raise ValueError("no per-layer key-value head counts to tell Mamba2 layers apart")
    s = _ssm(meta, prefix, names)
    experts = _granite_experts(meta, prefix)
    config: dict[str, Any] = {
        "layer_types": ["attention" if n else "mamba" for n in kv_heads],
        "mamba_n_heads": s.heads,
        "mamba_d_head": s.head_dim,
        "mamba_expand": s.expand,
        "mamba_d_state": s.state,
        "mamba_d_conv": s.conv,
        "mamba_n_groups": s.groups,
        "mamba_proj_bias": s.in_bias,
        "mamba_conv_bias": s.conv_bias,
        **_granite_multipliers(meta, prefix),
        "position_embedding_type": (
            "rope" if meta.get(prefix + "rope.scaling.finetuned", True) else "nope"
        ),
        **experts,
    }
    if experts["num_local_experts"]:
        config["shared_intermediate_size"] = _int(
            meta.require(prefix + "expert_shared_feed_forward_length")
        )
    return config


def falcon_h1_config(meta: _Metadata, prefix: str, names: set[str]) -> dict[str, Any]:
    """Falcon-H1's config beside the common keys: the Mamba2 sizes (its channels need not
    be a multiple of the width), and every multiplier one, as llama.cpp folded them."""
    s = _ssm(meta, prefix, names, widths=False)
    folded = ("attention_in", "attention_out", "embedding", "key", "lm_head", "ssm_in", "ssm_out")
    return {
        "mamba_d_ssm": s.heads * s.head_dim,
        "mamba_n_heads": s.heads,
        "mamba_d_head": s.head_dim,
        "mamba_d_state": s.state,
        "mamba_d_conv": s.conv,
        "mamba_n_groups": s.groups,
        "mamba_proj_bias": s.in_bias,
        "mamba_conv_bias": s.conv_bias,
        "mamba_rms_norm": any(n.endswith(".ssm_norm.weight") for n in names),
        **{f"{m}_multiplier": 1.0 for m in folded},
        "mlp_multipliers": [1.0, 1.0],
        "ssm_multipliers": [1.0] * 5,
    }


def nemotron_config(
    meta: _Metadata, prefix: str, kv_heads: Sequence[int] | None, names: set[str], layers: int
) -> dict[str, Any]:
    """Nemotron-H's config beside the common keys: its ``layers``' kinds (``M`` Mamba2,
    ``*`` attention, ``-`` an MLP, ``E`` experts; the lists also cover a folded MTP
    block), the Mamba2 sizes and the experts."""
    widths = meta.require(prefix + "feed_forward_length")
    if kv_heads is None or not isinstance(widths, list) or len(widths) != len(kv_heads):
        raise ValueError("no per-layer key-value heads and widths to tell the layers apart")
    kv_heads, widths = kv_heads[:layers], widths[:layers]
    experts = _int(meta.get(prefix + "expert_count", 0))
    mlp = "E" if experts else "-"
    pattern = [
        "*" if kv else mlp if _int(w) else "M" for kv, w in zip(kv_heads, widths, strict=True)
    ]
    s = _ssm(meta, prefix, names)
    config: dict[str, Any] = {
        "hybrid_override_pattern": pattern,
        "intermediate_size": max(_int(w) for w in widths),
        "mamba_num_heads": s.heads,
        "mamba_head_dim": s.head_dim,
        "ssm_state_size": s.state,
        "conv_kernel": s.conv,
        "n_groups": s.groups,
        "mamba_proj_bias": s.in_bias,
        "use_conv_bias": s.conv_bias,
        "use_bias": False,
        "layer_norm_epsilon": _f32(meta.get(prefix + "attention.layer_norm_rms_epsilon", 1e-5)),
    }
    if experts:
        shared = any(n.endswith(".ffn_up_shexp.weight") for n in names)
        config |= {
            "n_routed_experts": experts,
            "num_experts_per_tok": _int(meta.require(prefix + "expert_used_count")),
            "moe_intermediate_size": _int(meta.require(prefix + "expert_feed_forward_length")),
            "moe_shared_expert_intermediate_size": (
                _int(meta.require(prefix + "expert_shared_feed_forward_length")) if shared else None
            ),
            "n_shared_experts": _int(meta.get(prefix + "expert_shared_count", 1))
            if shared
            else None,
            "n_group": _int(meta.get(prefix + "expert_group_count", 1)),
            "topk_group": _int(meta.get(prefix + "expert_group_used_count", 1)),
            "norm_topk_prob": bool(meta.get(prefix + "expert_weights_norm", False)),
            "routed_scaling_factor": _f32(meta.get(prefix + "expert_weights_scale", 1.0)),
        }
        if (latent := meta.get(prefix + "moe_latent_size")) is not None:
            config["moe_latent_size"] = _int(latent)
    return config


def alone_config(meta: _Metadata, prefix: str, names: set[str], layers: int) -> dict[str, Any]:
    """A model of Mamba2 layers alone (Mamba2Model writes no attention, and a context of
    2**20: the recurrence has no limit of its own)."""
    s = _ssm(meta, prefix, names)
    return {
        "hidden_size": _int(meta.require(prefix + "embedding_length")),
        "num_hidden_layers": layers,
        "num_heads": s.heads,
        "head_dim": s.head_dim,
        "intermediate_size": s.heads * s.head_dim,
        "expand": s.expand,
        "state_size": s.state,
        "conv_kernel": s.conv,
        "n_groups": s.groups,
        "use_bias": s.in_bias,
        "use_conv_bias": s.conv_bias,
        "layer_norm_epsilon": _f32(meta.get(prefix + "attention.layer_norm_rms_epsilon", 1e-5)),
        "time_step_limit": [0.0, float("inf")],
        "time_step_rank": "auto",
        "max_position_embeddings": _int(meta.get(prefix + "context_length", 2**20)),
    }


def mamba_config(meta: _Metadata, prefix: str, names: set[str], layers: int) -> dict[str, Any]:
    """A model of Mamba (v1) layers alone, as MambaModel writes it: no attention, a context of
    2**20, and Falcon-Mamba's RMS norms of dt, B and C said by ``ssm.dt_b_c_rms``."""
    return {
        "hidden_size": _int(meta.require(prefix + "embedding_length")),
        "num_hidden_layers": layers,
        "intermediate_size": _int(meta.require(prefix + "ssm.inner_size")),
        "state_size": _int(meta.require(prefix + "ssm.state_size")),
        "conv_kernel": _int(meta.require(prefix + "ssm.conv_kernel")),
        "time_step_rank": _int(meta.require(prefix + "ssm.time_step_rank")),
        "use_bias": any(n.endswith(".ssm_in.bias") for n in names),
        "use_conv_bias": any(n.endswith(".ssm_conv1d.bias") for n in names),
        # Its norms of dt, B and C keep mlx-lm's epsilon, Falcon-Mamba's (the file has none).
        "use_bcdt_rms": bool(meta.get(prefix + "ssm.dt_b_c_rms", False)),
        "max_position_embeddings": _int(meta.get(prefix + "context_length", 2**20)),
    }
