from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.engine import IncompatiblePairError, ModelError, load_pair
from app.engine.loader import load_model, read_config
from tests.conftest import TinyModels


def _broken(tmp_path: Path, tiny: TinyModels, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(tiny.target, folder)
    return folder


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no such folder"):
        load_model(tmp_path / "absent")


def test_file_instead_of_folder(tmp_path: Path) -> None:
    f = tmp_path / "model.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelError, match="not a folder"):
        load_model(f)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: (d / "config.json").unlink(), "no config.json"),
        (lambda d: (d / "config.json").write_text("{"), "config.json is unreadable"),
        (lambda d: (d / "config.json").write_text("{}"), "names no model_type"),
        (
            lambda d: (d / "config.json").write_text(json.dumps({"model_type": "nope"})),
            "architecture 'nope' is not supported",
        ),
        (lambda d: (d / "model.safetensors").unlink(), "no .safetensors weights"),
        (lambda d: (d / "tokenizer.json").unlink(), "no tokenizer"),
        (lambda d: (d / "model.safetensors").write_bytes(b"\0" * 16), "cannot load"),
    ],
)
def test_broken_folder_gets_a_one_line_reason(tmp_path, tiny, mutate, reason) -> None:
    folder = _broken(tmp_path, tiny, "broken")
    mutate(folder)
    with pytest.raises(ModelError, match=reason) as info:
        load_model(folder)
    assert "\n" not in str(info.value)


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
