"""Parameter counts as a model's makers give them: a tied output stored twice counts once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from app.hub.library import inspect_model

VOCAB, HIDDEN = 64, 16


def _model(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    save_file(tensors, str(path / "model.safetensors"))
    return path


def _embedding() -> np.ndarray:
    rng = np.random.default_rng(0)
    embed = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    embed[-4:] = 0  # padding rows past the vocabulary
    return embed


BODY = VOCAB * HIDDEN + HIDDEN * HIDDEN  # the embedding and one layer


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        # A tied model's output stored again, as a GGUF file keeps it: counted once.
        (lambda e: e.copy(), BODY),
        # The same, dequantized from another precision than the embedding's.
        (lambda e: e + np.float32(0.01) * np.sign(e), BODY),
        (lambda e: e.astype(np.float16), BODY),
        # A head trained apart (Llama 3.1 8B, Qwen2.5 7B): it is the model's, counted.
        (lambda e: np.random.default_rng(1).standard_normal(e.shape).astype(np.float32), None),
    ],
    ids=["copy", "requantized-copy", "float16-copy", "trained"],
)
def test_an_output_that_repeats_the_embedding_counts_once(
    tmp_path: Path,
    head,
    expected: int | None,  # type: ignore[no-untyped-def]
) -> None:
    embed = _embedding()
    folder = _model(
        tmp_path / "m",
        {
            "model.embed_tokens.weight": embed,
            "model.layers.0.mlp.weight": np.ones((HIDDEN, HIDDEN), np.float32),
            "lm_head.weight": head(embed),
        },
    )
    info = inspect_model(folder)
    assert info.parameters == (expected or BODY + VOCAB * HIDDEN)
