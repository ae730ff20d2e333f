from __future__ import annotations

from pathlib import Path

import pytest

from app.engine import IncompatiblePairError, ModelError, load_pair
from app.engine.loader import load_model, read_config
from tests.conftest import TinyModels


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no such folder"):
        load_model(tmp_path / "absent")


def test_file_instead_of_folder(tmp_path: Path) -> None:
    f = tmp_path / "model.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelError, match="not a folder"):
        load_model(f)


def test_read_config_reads_no_weights(tiny: TinyModels) -> None:
    assert read_config(tiny.target)["model_type"] == "llama"


def test_pair_with_another_tokenizer_is_refused(tiny: TinyModels) -> None:
    with pytest.raises(IncompatiblePairError) as info:
        load_pair(tiny.target, tiny.foreign)
    message = str(info.value)
    assert "vocabulary sizes differ (384 vs 320)" in message
    assert "different ids" in message


def test_pair_of_two_architectures_loads(tiny: TinyModels) -> None:
    pair = load_pair(tiny.target, tiny.draft)
    assert pair.draft is not None
    assert pair.label == "tiny-llama + tiny-qwen2"
