"""Tiny random-weight models of one mlx-lm family, built in process, and their caches."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from app.engine.fuse import fuse
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


def cache_of(model: nn.Module, prompt: list[int]) -> list[Any]:
    """``model``'s cache after reading ``prompt``."""
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array(prompt)[None], cache=cache))
    return cache


WINDOW = 16  # the sliding window of the tiny windowed families
FAMILIES = ("gemma3_text", "gemma4_text", "gpt_oss")


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
    else:
        config.update(
            num_local_experts=4,
            num_experts_per_tok=2,
            intermediate_size=64,
            layer_types=["sliding_attention", "full_attention"],
        )
    return config


def _silence_the_end(weights: Path, eos: int) -> None:
    """Zeroes the end token's output row, so that replies run long enough to pass the window."""
    params = mx.load(str(weights))
    assert isinstance(params, dict)
    for name in ("lm_head.weight", "model.embed_tokens.weight"):
        if name in params:
            params[name][eos] = 0.0
    mx.save_safetensors(str(weights), params, metadata={"format": "mlx"})


def window_pair(root: Path, family: str, tokenizer_from: Path) -> tuple[Path, Path]:
    """Folders of a tiny windowed ``family`` target and a byte copy of it (every draft right)."""
    target = build_model(root / "target", window_config(family), tokenizer_from=tokenizer_from)
    config = json.loads((target / "config.json").read_text())
    _silence_the_end(target / "model.safetensors", config["eos_token_id"])
    copy = build_model(root / "copy", config, tokenizer_from=tokenizer_from, weights_from=target)
    return target, copy
