"""Shared fixtures: an isolated home and tiny random-weight models."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.fakes import MemoryKeyring

# Isolate platformdirs, QSettings and keyring from the developer's own files.
_HOME = Path(tempfile.mkdtemp(prefix="tandem-test-home-"))
for _var, _sub in (
    ("HOME", ""),
    ("XDG_DATA_HOME", ".local/share"),
    ("XDG_CONFIG_HOME", ".config"),
    ("XDG_CACHE_HOME", ".cache"),
    ("XDG_STATE_HOME", ".local/state"),
):
    os.environ[_var] = str(_HOME / _sub)
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ["HF_HUB_OFFLINE"] = "1"


@dataclass(frozen=True)
class TinyModels:
    """Folders of tiny models that share one tokenizer."""

    target: Path  # llama
    draft: Path  # qwen2, independent weights
    copy: Path  # the target's own weights: full acceptance
    noisy: Path  # the target's weights plus noise: partial acceptance
    foreign: Path  # another tokenizer and vocabulary size


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    from app.testing.tiny import build_model, model_config, train_tokenizer

    root = tmp_path_factory.mktemp("models")
    target = build_model(root / "tiny-llama", model_config("llama"), seed=0)
    draft = build_model(
        root / "tiny-qwen2",
        model_config("qwen2", hidden_size=32, num_hidden_layers=1, num_attention_heads=2),
        tokenizer_from=target,
        seed=1,
    )
    copy = build_model(root / "tiny-copy", tokenizer_from=target, weights_from=target)
    noisy = build_model(
        root / "tiny-noisy", tokenizer_from=target, weights_from=target, noise=0.01, seed=2
    )
    foreign_tok = root / "foreign-tokenizer"
    train_tokenizer(foreign_tok, vocab_size=320, corpus=["another corpus entirely"])
    foreign = build_model(
        root / "tiny-foreign",
        model_config("llama", vocab_size=320),
        tokenizer_from=foreign_tok,
        seed=3,
    )
    return TinyModels(target, draft, copy, noisy, foreign)


@pytest.fixture(scope="session")
def small_draft(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft sharing the target's tokenizer with under a quarter of its parameters."""
    from app.testing.tiny import build_model, model_config

    config = model_config(
        "llama", hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    config["tie_word_embeddings"] = True
    root = tmp_path_factory.mktemp("small")
    return build_model(root / "tiny-small", config, tokenizer_from=tiny.target, seed=4)


@pytest.fixture(scope="session")
def tiny_pair(tiny: TinyModels):
    """The target with its copy as draft, loaded once on the main thread."""
    from app.engine import load_pair

    return load_pair(tiny.target, tiny.copy)


# The keychain, faked: a test asks for `memory` to get a MemoryKeyring in place.
@pytest.fixture
def use_keyring() -> Iterator[None]:
    """Lets a test set its own keyring backend; the previous one is restored afterwards."""
    import keyring

    previous = keyring.get_keyring()
    yield
    keyring.set_keyring(previous)


@pytest.fixture
def memory(use_keyring: None) -> MemoryKeyring:
    import keyring

    from tests.fakes import MemoryKeyring

    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    return backend
