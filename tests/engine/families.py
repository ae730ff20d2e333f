"""Tiny random-weight models of one mlx-lm family, built in process, and their caches."""

from __future__ import annotations

import importlib
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from app.engine.fuse import fuse
from app.testing.tiny import model_config


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
