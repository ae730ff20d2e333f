"""A FIFO or a link to a device in place of a model's config.json is refused, never read."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.errors import ModelError
from app.hub import check_pair, scan_library
from tests.conftest import TinyModels
from tests.fakes import _tandem_here, _tandem_in_here


def _fifo(file: Path) -> None:
    os.mkfifo(file)


def _zero(file: Path) -> None:
    file.symlink_to("/dev/zero")


SPECIAL: dict[str, Callable[[Path], None]] = {"a FIFO": _fifo, "a link to /dev/zero": _zero}


def _special_model(tiny: TinyModels, folder: Path, kind: str, file: str = "config.json") -> Path:
    shutil.copytree(tiny.target, folder)
    (folder / file).unlink()
    SPECIAL[kind](folder / file)
    return folder


@pytest.mark.timeout(20)
@pytest.mark.parametrize("file", ["config.json", "tokenizer_config.json"])
@pytest.mark.parametrize("kind", list(SPECIAL))
def test_the_library_scan_lists_the_model_with_its_problem_at_once(
    tiny: TinyModels, tmp_path: Path, kind: str, file: str
) -> None:
    models = tmp_path / "models"
    _special_model(tiny, models / "special", kind, file)
    shutil.copytree(tiny.target, models / "fine")
    start = time.monotonic()
    found = {m.name: m for m in scan_library(models, tmp_path / "no-hub-cache")}
    assert time.monotonic() - start < 10
    assert found["fine"].problem is None
    assert (
        found["special"].problem
        == f"special: {file} is not a regular file (a device, FIFO or socket)"
    )


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", list(SPECIAL))
def test_check_pair_refuses_such_a_folder_in_one_line(
    tiny: TinyModels, tmp_path: Path, kind: str
) -> None:
    draft = _special_model(tiny, tmp_path / "special", kind)
    with pytest.raises(ModelError, match=r"^special: config\.json is not a regular file"):
        check_pair(tiny.target, draft)
    r = _tandem_here("check-pair", str(tiny.target), str(draft))
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "tandem: special: config.json is not a regular file (a device, FIFO or socket)"
    ]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", list(SPECIAL))
def test_tandem_models_list_shows_such_a_folder_as_a_problem(
    tiny: TinyModels, tmp_path: Path, kind: str
) -> None:
    models = tmp_path / "data" / "Tandem" / "models"
    _special_model(tiny, models / "special", kind)
    r = _tandem_in_here(tmp_path, "models", "list", "--json")
    assert r.returncode == 0, r.stderr
    (listed,) = json.loads(r.stdout)
    assert "config.json is not a regular file" in listed["problem"]
