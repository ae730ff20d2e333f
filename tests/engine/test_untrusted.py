"""Model files are untrusted: no pickles, no code from the folder, a sandboxed template."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from app.engine import Message, load_pair
from app.engine.generate import encode_chat
from app.engine.loader import load_model
from app.errors import ModelError
from tests.conftest import TinyModels

MARKER = "tandem-untrusted-code-ran"


class _Evil:
    """Unpickling this writes the marker: the proof that a pickle was loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.write_text, (self.path, "ran"))


def _copy(tiny: TinyModels, tmp_path: Path, name: str) -> Path:
    return shutil.copytree(tiny.target, tmp_path / name)


def test_pickled_weights_are_never_loaded(tiny: TinyModels, tmp_path: Path) -> None:
    folder = _copy(tiny, tmp_path, "pickled")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / MARKER
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Evil(marker)))
    with pytest.raises(ModelError, match=r"no \.safetensors weights"):
        load_model(folder)
    assert not marker.exists()


def test_a_custom_model_module_is_not_imported(tiny: TinyModels, tmp_path: Path) -> None:
    folder = _copy(tiny, tmp_path, "custom")
    marker = tmp_path / MARKER
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((folder / "config.json").read_text())
    config["model_file"] = "evil.py"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="custom module") as info:
        load_model(folder)
    assert "\n" not in str(info.value)
    assert not marker.exists()


def test_tokenizer_code_from_the_folder_is_not_run(tiny: TinyModels, tmp_path: Path) -> None:
    folder = _copy(tiny, tmp_path, "remote-tokenizer")
    marker = tmp_path / MARKER
    (folder / "evil_tokenizer.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    tok_config["auto_map"] = {"AutoTokenizer": ["evil_tokenizer.EvilTokenizer", None]}
    tok_config.pop("tokenizer_class", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    try:
        load_model(folder)
    except ModelError as exc:  # refusing is fine too; running the code is not
        assert "\n" not in str(exc)
    assert not marker.exists()


def test_a_chat_template_cannot_escape_its_sandbox(tiny: TinyModels, tmp_path: Path) -> None:
    folder = _copy(tiny, tmp_path, "escape")
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = (
        "{{ ''.__class__.__mro__[1].__subclasses__() }}{% for m in messages %}{{ m.content }}"
        "{% endfor %}"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    tokenizer = load_pair(folder).target.tokenizer
    with pytest.raises(ModelError, match="the model's chat template is unsafe") as info:
        encode_chat(tokenizer, [Message("user", "Hi")])
    assert "\n" not in str(info.value)


def test_a_broken_chat_template_is_a_clear_error(tiny: TinyModels, tmp_path: Path) -> None:
    folder = _copy(tiny, tmp_path, "broken-template")
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = "{% for m in messages %}{{ m.content }"
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    tokenizer = load_pair(folder).target.tokenizer
    with pytest.raises(ModelError, match="the model's chat template is broken"):
        encode_chat(tokenizer, [Message("user", "Hi")])
