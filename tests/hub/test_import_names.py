"""An import's name is a plain folder name in the models folder, and a folder import honours it."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import ModelError
from app.hub.gguf_import import import_folder, import_gguf
from tests.conftest import TinyModels
from tests.fakes import _tandem_in_here

BAD_NAMES = ["../../x", "../x", "/tmp/x", "a/b", "..", ".", "", ".hidden"]


def _models(home: Path) -> Path:
    return home / "data" / "Tandem" / "models"


@pytest.mark.parametrize("name", BAD_NAMES)
def test_tandem_models_import_refuses_a_name_that_is_no_plain_folder_name(
    tiny: TinyModels, tmp_path: Path, name: str
) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")  # refused before it is read
    for source in (gguf, tiny.target):
        r = _tandem_in_here(tmp_path, "models", "import", str(source), "--name", name)
        assert r.returncode == 2
        assert r.stderr.splitlines() == [
            "tandem: --name: the name must be a plain folder name "
            f"(no '/', not hidden, not '.' or '..'), not {name!r}"
        ]
    # Nothing was written anywhere: not in the models folder, not beside or above it.
    assert not _models(tmp_path).exists() or not any(_models(tmp_path).iterdir())
    written = [p for p in tmp_path.rglob("*") if not p.is_dir()]
    assert written == [gguf]


def test_the_importers_refuse_such_a_name_themselves(tiny: TinyModels, tmp_path: Path) -> None:
    models = tmp_path / "models"
    with pytest.raises(ModelError, match="plain folder name"):
        import_folder(tiny.target, models, name="../escaped")
    with pytest.raises(ModelError, match="plain folder name"):
        import_gguf(tmp_path / "model.gguf", models / "..")
    assert not (tmp_path / "escaped").exists()


def test_a_folder_import_is_named_as_asked(tiny: TinyModels, tmp_path: Path) -> None:
    r = _tandem_in_here(tmp_path, "models", "import", str(tiny.target), "--name", "mine")
    assert r.returncode == 0, r.stderr
    out = _models(tmp_path) / "mine"
    assert r.stdout.strip() == str(out)
    assert (out / "config.json").is_file()
    assert not (_models(tmp_path) / tiny.target.name).exists()
