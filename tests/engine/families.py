"""Tiny random-weight models of one mlx-lm family, built in process, and their caches."""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from app.engine import GenerationParams, Message
from app.engine.decoder import Decoder, take_turns
from app.engine.fuse import fuse
from app.engine.generate import encode_chat
from app.engine.loader import ModelPair, config_model
from app.engine.recurrent import REWOUND
from app.engine.types import DraftSetting
from app.testing.tiny import build_model, model_config


def tiny_model(model_type: str, tied: bool = False, fused: bool = False) -> nn.Module:
    """A tiny ``model_type`` model, seeded; ``fused`` as the app loads models."""
    config = {**model_config(model_type), "tie_word_embeddings": tied}
    family = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(0)
    model: nn.Module = family.Model(family.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    if fused:  # q/k/v and gate/up as one matmul each
        fuse(model)
    return model


def plain_greedy(pair: ModelPair, prompt: list[int], n: int) -> list[int]:
    """mlx-lm's own greedy decoding over its own caches, to the end token: the reference."""
    eos = set(pair.target.tokenizer.eos_token_ids)
    out: list[int] = []
    for token, _ in generate_step(mx.array(prompt), pair.target.model, max_tokens=n):
        if int(token) in eos:
            break
        out.append(int(token))
    return out


def batch_replies(
    pair: ModelPair, chats: Sequence[list[Message]], tokens: int
) -> list[tuple[list[int], list[int]]]:
    """Each chat's prompt and reply, the chats replied to at once (greedy) by one decoder of
    ``pair``, drafting at k 1, 4 and Auto in turn."""
    assert pair.draft is not None
    decoder = Decoder(pair.target.model, pair.draft.model)
    prompts = [encode_chat(pair.target.tokenizer, m) for m in chats]
    ks = [(1, 4, None)[i % 3] for i in range(len(prompts))]
    gens = [
        decoder.generate(p, GenerationParams(temperature=0, drafting=DraftSetting.of(k)))
        for p, k in zip(prompts, ks, strict=True)
    ]
    return list(zip(prompts, take_turns(gens, tokens).replies, strict=True))


def cache_of(model: nn.Module, prompt: list[int]) -> list[Any]:
    """``model``'s cache after reading ``prompt``."""
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array(prompt)[None], cache=cache))
    return cache


WINDOW = 16  # the sliding window of the tiny windowed families
FAMILIES = (
    "gemma3_text",
    "gemma4_text",
    "gpt_oss",
    "mimo_v2_flash",
    "llama4",
    "gemma3n",
    "deepseek_v41",
)


def window_config(family: str) -> dict[str, Any]:
    config = model_config(family, num_hidden_layers=2 if family == "gpt_oss" else 4)
    config.update(head_dim=16, sliding_window=WINDOW)
    if family == "gemma3_text":
        config.update(sliding_window_pattern=2, query_pre_attn_scalar=16)
    elif family == "gemma4_text":
        config.update(
            sliding_window_pattern=2,
            global_head_dim=16,
            num_kv_shared_layers=0,
            hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=config["vocab_size"],
            use_double_wide_mlp=False,
            layer_types=["sliding_attention", "full_attention"] * 2,
        )
    elif family == "mimo_v2_flash":
        config.update(mimo_v2_flash_config(config))
    elif family == "deepseek_v41":
        return deepseek_v4_config(config)
    elif family == "llama4":  # Llama 4: attention within chunks in 3 of 4 layers, experts
        text = {
            **config,
            "model_type": "llama4_text",
            "attention_chunk_size": WINDOW,
            "attention_bias": False,
            "interleave_moe_layer_step": 2,
            "intermediate_size_mlp": 128,
            "num_local_experts": 4,
            "num_experts_per_tok": 1,
            "rope_scaling": None,
            "use_qk_norm": True,
        }
        return {**config, "text_config": text}
    elif family == "gemma3n":  # Gemma 3n: its last layers read the keys of earlier ones
        text = {
            **config,
            "model_type": "gemma3n_text",
            "num_kv_shared_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "vocab_size_per_layer_input": config["vocab_size"],
            "hidden_size_per_layer_input": 16,
            "rope_local_base_freq": 10000.0,
            "final_logit_softcapping": 30.0,
            "activation_sparsity_pattern": [0.0] * 4,
            "altup_num_inputs": 2,
            "altup_coef_clip": 120.0,
            "altup_correct_scale": True,
            "altup_active_idx": 0,
            "laurel_rank": 8,
        }
        return {**config, "text_config": text}
    else:
        config.update(
            num_local_experts=4,
            num_experts_per_tok=2,
            intermediate_size=64,
            layer_types=["sliding_attention", "full_attention"],
        )
    return config


def deepseek_v4_config(base: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V4: every layer a sliding window; its layers 1-3 compress their keys (4 rows a
    group, 1 in layer 2) and 1 and 3 index them, layer 1 choosing candidate blocks."""
    keep = ("vocab_size", "eos_token_id", "bos_token_id", "tie_word_embeddings")
    return {
        **{k: base[k] for k in keep if k in base},
        "model_type": "deepseek_v41",
        "hidden_size": 32,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "head_dim": 16,
        "q_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "o_groups": 2,
        "o_lora_rank": 8,
        "moe_intermediate_size": 16,
        "n_routed_experts": 2,
        "num_experts_per_tok": 1,
        "sliding_window": WINDOW,
        "compress_ratios": [0, 4, 1, 4],
        "kv_source_layer_ids": [1, 2, 3],
        "index_source_layer_ids": [1, 3],
        "candidate_source_layer_id": 1,
        "candidate_topk_blocks": 2,
        "candidate_block_size": 2,
        "index_n_heads": 2,
        "index_head_dim": 16,
        "index_topk": 4,
        "hc_mult": 2,
        "hc_sinkhorn_iters": 3,  # 20 in its configs: the tiny model's steps would crawl
    }


def mimo_v2_flash_config(base: dict[str, Any]) -> dict[str, Any]:
    """MiMo-V2-Flash's keys: sliding-window layers with attention sinks among full ones,
    a mixture of 4 experts in every other layer, K and V of different widths."""
    layers = base["num_hidden_layers"]
    return {
        "hybrid_layer_pattern": [0, 1, 1, 1][:layers],
        "moe_layer_freq": [0, 1] * (layers // 2),
        "add_swa_attention_sink_bias": True,
        "add_full_attention_sink_bias": False,
        "sliding_window_size": base.get("sliding_window", WINDOW),
        "num_experts_per_tok": 2,
        "n_routed_experts": 4,
        "n_shared_experts": None,
        "moe_intermediate_size": 32,
        "routed_scaling_factor": 1.0,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "n_group": 1,
        "topk_group": 1,
        "layernorm_epsilon": 1e-5,
        "swa_rope_theta": 10000.0,
        "swa_num_attention_heads": 4,
        "swa_num_key_value_heads": 4,
        "head_dim": 32,
        "v_head_dim": 16,
        "swa_head_dim": 32,
        "swa_v_head_dim": 16,
        "partial_rotary_factor": 0.5,
        "attention_value_scale": 0.7,
    }


def _silence_the_end(weights: Path, eos: int) -> None:
    """Zeroes the end token's output row, so that replies run long enough to pass the window."""
    params = mx.load(str(weights))
    assert isinstance(params, dict)
    for name in ("lm_head.weight", "model.embed_tokens.weight", "language_model.lm_head.weight"):
        if name in params:
            params[name][eos] = 0.0
    mx.save_safetensors(str(weights), params, metadata={"format": "mlx"})


# Families whose mlx-lm classes start with zeros what acts on the states (Baichuan-M1's
# convolution taps, RecurrentGemma's convolution and gates, RWKV-7's token-shift mixes):
# left so, a tiny model's states would change nothing.
_ZEROED = ("baichuan_m1", "recurrent_gemma", "rwkv7")


def _randomize_zeros(weights: Path) -> None:
    """Gives the tensors that are all zeros random values, seeded."""
    params = mx.load(str(weights))
    assert isinstance(params, dict)
    mx.random.seed(1)
    for name, value in params.items():
        if not mx.any(value).item():
            params[name] = mx.random.uniform(-0.5, 0.5, value.shape)
    mx.save_safetensors(str(weights), params, metadata={"format": "mlx"})


def window_pair(root: Path, family: str, tokenizer_from: Path) -> tuple[Path, Path]:
    """Folders of a tiny windowed ``family`` target and a byte copy of it (every draft right)."""
    target = build_model(root / "target", window_config(family), tokenizer_from=tokenizer_from)
    config = json.loads((target / "config.json").read_text())
    _silence_the_end(target / "model.safetensors", config["eos_token_id"])
    copy = build_model(root / "copy", config, tokenizer_from=tokenizer_from, weights_from=target)
    return target, copy


# Families with recurrent layers: every one Tandem rewinds, each tested.
HYBRIDS = tuple(sorted(REWOUND))


def hybrid_config(family: str, seed_layers: int = 4) -> dict[str, Any]:
    """A tiny ``family`` config: ``seed_layers`` layers, recurrent and attention mixed."""
    base = model_config(family, num_hidden_layers=seed_layers)
    gdn = dict(
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=2,
        head_dim=16,
        partial_rotary_factor=0.25,
        rope_theta=10000.0,
    )
    if family in ("qwen3_5", "qwen3_5_moe"):
        text = {**base, **gdn, "model_type": f"{family}_text"}
        if family == "qwen3_5_moe":  # Qwen3.5 / 3.6's mixture-of-experts models (35B-A3B)
            text.update(
                num_experts=4,
                num_experts_per_tok=2,
                shared_expert_intermediate_size=64,
                moe_intermediate_size=32,
            )
        return {**base, "model_type": family, "text_config": text}
    if family == "qwen3_next":
        return {
            **base,
            **gdn,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "shared_expert_intermediate_size": 64,
            "mlp_only_layers": [],
            "moe_intermediate_size": 32,
        }
    mamba = dict(
        mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16, mamba_d_conv=4, mamba_n_groups=1
    )
    if family == "nemotron_h":
        return {
            **base,
            "attention_bias": False,
            "mamba_num_heads": 4,
            "mamba_head_dim": 16,
            "mamba_proj_bias": False,
            "ssm_state_size": 16,
            "conv_kernel": 4,
            "n_groups": 1,
            "mlp_bias": False,
            "layer_norm_epsilon": 1e-5,
            "use_bias": False,
            "use_conv_bias": True,
            "hybrid_override_pattern": "M*M-",
            "head_dim": 16,
        }
    if family == "lfm2":
        return {
            **base,
            "norm_eps": 1e-5,
            "conv_bias": False,
            "conv_L_cache": 3,
            "block_dim": 64,
            "block_multiple_of": 16,
            "block_ffn_dim_multiplier": 1.0,
            "block_auto_adjust_ff_dim": False,
            "block_ff_dim": 128,
            "full_attn_idxs": [1, 3],
        }
    if family == "granitemoehybrid":
        return {
            **base,
            **mamba,
            "attention_bias": False,
            "embedding_multiplier": 1.0,
            "attention_multiplier": 0.25,
            "logits_scaling": 1.0,
            "residual_multiplier": 1.0,
            "layer_types": ["mamba", "attention", "mamba", "attention"],
            "mamba_expand": 1,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "shared_intermediate_size": 64,
            "mamba_proj_bias": False,
            "mamba_conv_bias": True,
            "tie_word_embeddings": False,
        }
    if family == "falcon_h1":
        return {
            **base,
            **mamba,
            "head_dim": 16,
            "mamba_d_ssm": 64,
            "mamba_expand": 1,
            "mlp_expansion_factor": 2,
            "tie_word_embeddings": False,
        }
    if family == "jamba":
        return {
            **base,
            "attn_layer_offset": 1,
            "attn_layer_period": 2,
            "expert_layer_offset": 1,
            "expert_layer_period": 2,
            "mamba_d_conv": 4,
            "mamba_d_state": 8,
            "mamba_expand": 1,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "tie_word_embeddings": False,
        }
    if family == "kimi_linear":
        return {
            **base,
            "head_dim": 16,
            "linear_attn_config": {
                "kda_layers": [1, 3],
                "full_attn_layers": [2, 4],
                "num_heads": 4,
                "head_dim": 16,
                "short_conv_kernel_size": 4,
            },
            "model_max_length": 4096,
            "num_experts": 4,
            "num_experts_per_token": 2,
            "moe_intermediate_size": 32,
            "kv_lora_rank": 16,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "first_k_dense_replace": 1,
        }
    if family == "lfm2_moe":  # LFM2-8B-A1B's kind: short convolutions, a mixture of experts
        return {
            **base,
            "norm_eps": 1e-5,
            "conv_bias": False,
            "conv_L_cache": 3,
            "moe_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "use_expert_bias": True,
            "num_dense_layers": 1,
            "full_attn_idxs": [1, 3],
        }
    if family == "mamba2":  # Mamba2 alone, no attention (Mamba-Codestral)
        return {
            **base,
            "num_heads": 4,
            "head_dim": 16,
            "state_size": 16,
            "layer_norm_epsilon": 1e-5,
            "conv_kernel": 4,
            "n_groups": 1,
            "use_bias": False,
            "use_conv_bias": True,
            "time_step_limit": [0.0, float("inf")],
            "time_step_rank": "auto",
            "expand": 1,
        }
    if family == "olmo_hybrid":
        return {
            **{k: v for k, v in gdn.items() if k not in ("full_attention_interval",)},
            **base,
            "head_dim": 16,
            "linear_allow_neg_eigval": True,
            "attention_bias": False,
            "layer_types": ["linear_attention", "full_attention"] * (seed_layers // 2),
        }
    if family == "mamba":  # Mamba alone (Falcon-Mamba)
        return {
            **base,
            "state_size": 16,
            "conv_kernel": 4,
            "use_bias": False,
            "use_conv_bias": True,
            "time_step_rank": "auto",
        }
    if family == "plamo2":  # Plamo 2: Mamba layers, attention every 2nd
        return {
            **base,
            "hidden_size_per_head": 16,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_num_heads": 4,
            "mamba_step": 2,
            "tie_word_embeddings": False,
        }
    if family == "baichuan_m1":  # Baichuan-M1: a two-tap convolution of keys and values
        return {
            **base,
            "sliding_window": 16,
            "sliding_window_layers": [1, 3],
            "conv_window": 2,
        }
    # Ling's models: linear attention (lightning or Kimi Delta), attention every 2nd
    ling = {
        "head_dim": 16,
        "layer_group_size": 2,
        "group_norm_size": 1,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "moe_intermediate_size": 32,
        "moe_shared_expert_intermediate_size": 32,
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": True,
    }
    mla = {"q_lora_rank": None, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
           "qk_rope_head_dim": 8, "v_head_dim": 16}  # fmt: skip
    if family == "bailing_moe_linear":  # lightning attention
        return {**base, **ling, "use_qk_norm": True}
    if family == "bailing_hybrid":  # lightning attention, latent attention
        return {**base, **ling, **mla}
    if family == "bailing_moe_v3":  # Ling 2.5: Kimi Delta Attention, latent attention
        return {
            **base,
            **ling,
            **mla,
            "model_type": "bailing_hybrid",
            "architectures": ["BailingMoeV3ForCausalLM"],
            "rope_theta": 10000.0,
        }
    if family == "recurrent_gemma":  # RecurrentGemma (Griffin): RG-LRU and local attention
        return {
            **base,
            "attention_bias": False,
            "conv1d_width": 4,
            "logits_soft_cap": 30.0,
            "attention_window_size": 16,
            "block_types": ["recurrent", "attention"],
        }
    if family == "rwkv7":  # RWKV-7: time mixing alone, no attention
        return {
            **base,
            "norm_eps": 1e-5,
            "head_dim": 16,
            "a_low_rank_dim": 8,
            "v_low_rank_dim": 8,
            "gate_low_rank_dim": 8,
            "decay_low_rank_dim": 8,
        }
    if family == "kimi_k3":  # Kimi K3: Kimi-Linear's layers, with block residuals
        kimi = hybrid_config("kimi_linear", seed_layers)
        return {**kimi, "model_type": family, "attn_res_block_size": 2, "num_shared_experts": 1}
    if family == "longcat_flash_ngram":  # LongCat-Flash: an n-gram embedding of the last tokens
        return {
            **base,
            "num_layers": 2,
            "ffn_hidden_size": 64,
            "moe_topk": 2,
            "expert_ffn_hidden_size": 32,
            "n_routed_experts": 4,
            "zero_expert_num": 1,
            "kv_lora_rank": 16,
            "q_lora_rank": 32,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16,
            "v_head_dim": 16,
            "routed_scaling_factor": 1.0,
            "mla_scale_q_lora": True,
            "mla_scale_kv_lora": True,
            "ngram_vocab_size_ratio": 2,
            "emb_neighbor_num": 3,
            "emb_split_num": 2,
        }
    raise ValueError(f"no tiny config for {family}")


def hybrid_pair(root: Path, family: str, tokenizer_from: Path) -> tuple[Path, Path, Path]:
    """Folders of a tiny hybrid ``family`` target, a byte copy of it (every draft right) and
    a draft of the same family with weights of its own (some drafts wrong)."""
    target = build_model(root / "target", hybrid_config(family), tokenizer_from=tokenizer_from)
    config = json.loads((target / "config.json").read_text())
    _silence_the_end(target / "model.safetensors", config["eos_token_id"])
    if family in _ZEROED:
        _randomize_zeros(target / "model.safetensors")
    copy = build_model(root / "copy", config, tokenizer_from=tokenizer_from, weights_from=target)
    other = build_model(
        root / "other", config, tokenizer_from=tokenizer_from, weights_from=target, noise=0.02
    )
    return target, copy, other


def mtp_model(root: Path, tokenizer_from: Path, seed: int = 11) -> Path:
    """A tiny Qwen3.5 target folder whose checkpoint carries an MTP head of random weights
    (Hugging Face's layout: ``mtp.*`` beside the backbone, norms stored as w - 1)."""
    from mlx.utils import tree_flatten

    from app.engine.mtp import MTPHead

    config = hybrid_config("qwen3_5")
    config["text_config"]["mtp_num_hidden_layers"] = 1
    folder = build_model(root, config, tokenizer_from=tokenizer_from)
    mx.random.seed(seed)
    head = MTPHead(config_model(config))
    params: list[tuple[str, mx.array]] = tree_flatten(head.parameters())  # type: ignore[assignment]
    stored = {f"mtp.{k}": v - 1.0 if k.endswith("norm.weight") else v for k, v in params}
    mx.save_safetensors(str(folder / "model-mtp.safetensors"), stored)
    return folder


# Families whose MTP head is a next-n layer (app.engine.mtp.filing).
NEXT_N_FAMILIES = (
    "glm4_moe",
    "glm4_moe_lite",
    "glm_moe_dsa",
    "deepseek_v3",
    "deepseek_v32",
    "mimo",
    "mimo_v2_flash",
    "nemotron_h",
)
_MLA = {"kv_lora_rank": 32, "q_lora_rank": None, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16}


def next_n_config(family: str = "glm4_moe", next_n: int = 1) -> dict[str, Any]:
    """A tiny model of a family whose MTP head is a next-n layer: GLM-4.5 (or GLM-4.7-Flash,
    GLM-5, DeepSeek-V3 or V3.2, their attention MLA), a dense layer, then a mixture of 4
    experts (2 a token, one shared); or MiMo, a dense model. ``next_n`` such layers; MiMo-V2-Flash
    (windowed, :func:`window_config`) has three, as its checkpoint does, and drafts with one."""
    if family == "mimo":
        return {**model_config(family), "num_nextn_predict_layers": next_n}
    if family == "mimo_v2_flash":
        return {**window_config(family), "num_nextn_predict_layers": 3}
    if family == "nemotron_h":  # its head: an attention block, then a mixture of experts
        moe = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "moe_shared_expert_intermediate_size": 32, "n_shared_experts": 1, "n_group": 1,
               "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0}  # fmt: skip
        mtp = {"num_nextn_predict_layers": next_n, "mtp_hybrid_override_pattern": "*E"}
        return {**hybrid_config(family), **moe, **mtp}
    config = {
        **model_config(family),
        "moe_intermediate_size": 32,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "norm_topk_prob": True,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "rope_scaling": None,
        "num_nextn_predict_layers": next_n,
    }
    if family == "glm4_moe_lite":
        return {**config, **_MLA, "num_key_value_heads": 4, "v_head_dim": 16}
    mla = {**_MLA, "q_lora_rank": 48, "num_key_value_heads": 4, "v_head_dim": 16}
    if family == "deepseek_v3":  # mlx-lm leaves out the next-n layer of 61 layers only
        return {**config, **mla, "num_hidden_layers": 61, "first_k_dense_replace": 60}
    # DeepSeek-V3.2's and GLM-5's sparse attention: an indexer picks 8 keys a query.
    dsa = {**mla, "index_head_dim": 16, "index_n_heads": 2, "index_topk": 8}
    if family == "deepseek_v32":
        return {**config, **dsa}
    if family == "glm_moe_dsa":
        extra = {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1,
                 "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
                 "attention_bias": False}  # fmt: skip
        return {**config, **dsa, **extra}
    return {**config, "head_dim": 16, "partial_rotary_factor": 0.5, "use_qk_norm": True,
            "attention_bias": True}  # fmt: skip
