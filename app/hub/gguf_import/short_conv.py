"""Short convolutions among attention: LFM2 and LFM2-MoE (llama.cpp's lfm2, lfm2moe).

llama.cpp's converter (``LFM2Model``, ``LFM2MoeModel``) edits little: the
depthwise convolution loses its middle axis of 1, the experts are stacked, the
routing bias becomes ``exp_probs_b.bias``, and the key-value head count is a
list with one entry a layer, 0 for a convolution. No norm is shifted and no
rotary row reordered. The final norm, which the checkpoints call
``embedding_norm``, is filed as ``token_embd_norm``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.hub.gguf_import.common import _f32, _int, _Metadata

TOP_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "token_embd_norm.weight": "model.embedding_norm.weight",
}

_LAYER_TENSORS = {
    "shortconv.conv": "conv.conv",
    "shortconv.in_proj": "conv.in_proj",
    "shortconv.out_proj": "conv.out_proj",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.out_proj",
    "attn_q_norm": "self_attn.q_layernorm",
    "attn_k_norm": "self_attn.k_layernorm",
    "attn_norm": "operator_norm",
    "ffn_norm": "ffn_norm",
}

BLOCK_TENSORS = {
    **_LAYER_TENSORS,
    "ffn_gate": "feed_forward.w1",
    "ffn_down": "feed_forward.w2",
    "ffn_up": "feed_forward.w3",
}

# LFM2-MoE's: dense leading layers, then experts stacked as mlx-lm's SwitchGLU holds them.
MOE_BLOCK_TENSORS = {
    **_LAYER_TENSORS,
    "ffn_gate": "feed_forward.gate_proj",
    "ffn_down": "feed_forward.down_proj",
    "ffn_up": "feed_forward.up_proj",
    "ffn_gate_inp": "feed_forward.gate",
    "ffn_gate_exps": "feed_forward.switch_mlp.gate_proj",
    "ffn_up_exps": "feed_forward.switch_mlp.up_proj",
    "ffn_down_exps": "feed_forward.switch_mlp.down_proj",
    "exp_probs_b.bias": "feed_forward.expert_bias",
}


def conv_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The checkpoint's (channels, 1, kernel) for a convolution llama.cpp stored 2-D."""
    if name.endswith(".conv.conv.weight") and len(shape) == 2:
        return (shape[0], 1, shape[1])
    return shape


def sizes(meta: _Metadata, prefix: str) -> dict[str, Any]:
    """The feed-forward widths: LFM2's (the width llama.cpp wrote is the one it adjusted),
    or LFM2-MoE's dense width and mixture of experts (sigmoid routing, the top scores
    normalized unless the file says otherwise)."""
    width = _int(meta.require(prefix + "feed_forward_length"))
    experts = meta.get(prefix + "expert_count")
    if not experts:
        return {"block_ff_dim": width, "block_auto_adjust_ff_dim": False}
    return {
        "intermediate_size": width,
        "num_experts": _int(experts),
        "num_experts_per_tok": _int(meta.require(prefix + "expert_used_count")),
        "moe_intermediate_size": _int(meta.require(prefix + "expert_feed_forward_length")),
        "num_dense_layers": _int(meta.get(prefix + "leading_dense_block_count", 0)),
        "norm_topk_prob": bool(meta.get(prefix + "expert_weights_norm", True)),
        "routed_scaling_factor": _f32(meta.get(prefix + "expert_weights_scale", 1.0)),
    }


def config(
    meta: _Metadata, prefix: str, kv_heads: Sequence[int] | None, names: set[str]
) -> dict[str, Any]:
    """What LFM2's config adds to the common keys: its layers' kinds (from each layer's
    key-value heads, 0 for a convolution), convolution and norm."""
    if kv_heads is None:
        raise ValueError("no per-layer key-value head counts to tell convolutions apart")
    return {
        "layer_types": ["full_attention" if n else "conv" for n in kv_heads],
        "full_attn_idxs": [i for i, n in enumerate(kv_heads) if n],
        "conv_L_cache": _int(meta.require(prefix + "shortconv.l_cache")),
        "conv_bias": any(n.endswith(".shortconv.in_proj.bias") for n in names),
        "norm_eps": _f32(meta.get(prefix + "attention.layer_norm_rms_epsilon", 1e-5)),
        "block_dim": _int(meta.require(prefix + "embedding_length")),
        "block_multiple_of": 256,
        "block_ffn_dim_multiplier": 1.0,
        "use_expert_bias": any(n.endswith(".exp_probs_b.bias") for n in names),
    }
