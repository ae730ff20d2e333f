"""Loading model folders and checking that a target and a draft fit together."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn


class ModelError(Exception):
    """A model folder that cannot be used; the message is one line for the user."""


class IncompatiblePairError(ModelError):
    """A target and a draft that cannot be used together."""


_CONTEXT_KEYS = (
    "max_position_embeddings",
    "max_sequence_length",
    "max_seq_len",
    "seq_length",
    "n_positions",
    "n_ctx",
)


def context_length(config: dict[str, Any]) -> int | None:
    """The trained context length a model's config gives, if any."""
    # Multimodal configs keep the language model's settings under text_config.
    text_config = config.get("text_config")
    for section in (config, text_config if isinstance(text_config, dict) else {}):
        for key in _CONTEXT_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


@dataclass(eq=False)
class LoadedModel:
    """A model and its tokenizer, ready to run on the thread that loaded them."""

    path: Path
    model: nn.Module
    tokenizer: Any  # mlx_lm.tokenizer_utils.TokenizerWrapper
    config: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def context_length(self) -> int | None:
        return context_length(self.config)


@dataclass(eq=False)
class ModelPair:
    """A target model and an optional draft model."""

    target: LoadedModel
    draft: LoadedModel | None = None
    decoder: Any = None  # the speculative.Decoder holding both KV caches

    @property
    def label(self) -> str:
        return f"{self.target.name} + {self.draft.name}" if self.draft else self.target.name


def read_config(path: Path) -> dict[str, Any]:
    """Validates a model folder without loading weights and returns its config.

    Raises:
        ModelError: With a one-line reason.
    """
    name = path.name or str(path)
    if not path.exists():
        raise ModelError(f"{path}: no such folder")
    if not path.is_dir():
        raise ModelError(f"{path}: not a folder")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelError(f"{name}: no config.json, so this is not a model folder")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{name}: config.json is unreadable ({first_line(exc)})") from exc
    if not isinstance(config, dict) or not config.get("model_type"):
        raise ModelError(f"{name}: config.json names no model_type")
    model_type = str(config["model_type"])
    try:
        importlib.import_module(f"mlx_lm.models.{model_type}")
    except ImportError as exc:
        raise ModelError(f"{name}: architecture '{model_type}' is not supported") from exc
    if not any(path.glob("*.safetensors")):
        raise ModelError(f"{name}: no .safetensors weights")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model")):
        raise ModelError(f"{name}: no tokenizer (tokenizer.json or tokenizer.model)")
    return config


def load_model(path: Path | str, *, fuse: bool = True) -> LoadedModel:
    """Loads a model folder with mlx-lm; never reaches for the network.

    Args:
        path: The model folder.
        fuse: Fuse each layer's projections (:mod:`app.engine.fuse`), which
            makes a step cheaper and leaves its arithmetic as it was.

    Raises:
        ModelError: With a one-line reason.
    """
    from mlx_lm.utils import load

    path = Path(path).expanduser().resolve()
    read_config(path)
    try:
        loaded = cast(tuple[Any, Any, dict[str, Any]], load(str(path), return_config=True))
        model, tokenizer, config = loaded
    except Exception as exc:  # mlx-lm raises many kinds for broken folders
        raise ModelError(f"{path.name}: cannot load ({first_line(exc)})") from exc
    if fuse:
        from app.engine.fuse import fuse as fuse_projections

        fuse_projections(model)
    return LoadedModel(path=path, model=model, tokenizer=tokenizer, config=config)


def pair_problems(target: LoadedModel, draft: LoadedModel) -> list[str]:
    """Reasons why ``draft`` cannot draft for ``target``; empty when they fit."""
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

    problems = []
    t_vocab, d_vocab = target.config.get("vocab_size"), draft.config.get("vocab_size")
    t_tok, d_tok = target.tokenizer, draft.tokenizer
    tokens = max(len(t_tok), len(d_tok))
    # Embedding rows past the tokenizer's tokens are padding, which may differ.
    if t_vocab != d_vocab and (not t_vocab or not d_vocab or min(t_vocab, d_vocab) < tokens):
        problems.append(f"vocabulary sizes differ ({t_vocab} vs {d_vocab})")
    if t_tok.get_vocab() != d_tok.get_vocab():
        problems.append("the tokenizers map tokens to different ids")
    if set(t_tok.eos_token_ids) != set(d_tok.eos_token_ids):
        problems.append("the end-of-sequence tokens differ")
    for role, m in (("target", target), ("draft", draft)):
        if not can_trim_prompt_cache(make_prompt_cache(m.model)):
            problems.append(f"the {role}'s cache cannot be rewound (hybrid or recurrent layers)")
    return problems


def load_pair(
    target: Path | str,
    draft: Path | str | None = None,
    *,
    fuse: bool = True,
    progress: Callable[[int, int, str], None] | None = None,
) -> ModelPair:
    """Loads a target and an optional draft and checks that they fit together.

    Args:
        target: The target's folder.
        draft: The draft's folder, if any.
        fuse: Fuse projections (see :func:`load_model`).
        progress: Called with (step, steps, what) before each step.

    Raises:
        ModelError: A folder cannot be loaded.
        IncompatiblePairError: The two models cannot be paired.
    """
    steps = 1 if draft is None else 3
    report = progress or (lambda _step, _steps, _what: None)
    report(0, steps, f"Loading {Path(target).name}")
    t = load_model(target, fuse=fuse)
    if draft is None:
        return ModelPair(t)
    report(1, steps, f"Loading {Path(draft).name}")
    d = load_model(draft, fuse=fuse)
    report(2, steps, "Checking the pair")
    problems = pair_problems(t, d)
    if problems:
        raise IncompatiblePairError(f"{d.name} cannot draft for {t.name}: " + "; ".join(problems))
    return ModelPair(t, d)


def free_memory() -> None:
    """Returns freed arrays to the system; call after dropping a pair, on its thread."""
    import gc

    gc.collect()
    mx.clear_cache()


def first_line(exc: BaseException) -> str:
    """An exception as one short line for the user."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
