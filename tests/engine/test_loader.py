from __future__ import annotations

from pathlib import Path

import pytest

from app.engine import load_pair
from app.engine.loader import load_model, read_config
from app.errors import IncompatiblePairError, ModelError
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


def test_the_pair_check_given_judges_the_pair_after_both_load(tiny: TinyModels) -> None:
    seen: list[tuple[Path, Path]] = []
    steps: list[str] = []

    def refuse(target: Path, draft: Path) -> None:
        seen.append((target, draft))
        raise IncompatiblePairError("tiny-foreign cannot draft for tiny-llama: no")

    with pytest.raises(IncompatiblePairError, match=r"^tiny-foreign cannot draft for tiny-llama"):
        load_pair(tiny.target, tiny.foreign, check=refuse, progress=lambda *a: steps.append(a[2]))
    assert seen == [(tiny.target, tiny.foreign)]  # the folders as given, for the same names
    assert steps[-1] == "Checking the pair"


def test_without_a_check_any_two_models_pair(tiny: TinyModels) -> None:
    # The rule is app.hub's (tests/hub/test_pair_check.py); the engine has none of its own.
    assert load_pair(tiny.target, tiny.foreign, fuse=False).draft is not None


def test_pair_of_two_architectures_loads(tiny: TinyModels) -> None:
    pair = load_pair(tiny.target, tiny.draft)
    assert pair.draft is not None
    assert pair.label == "tiny-llama + tiny-qwen2"


def test_a_draft_folder_that_is_no_model_is_refused_before_the_target_loads(
    tiny: TinyModels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.engine import loader

    loaded: list[Path] = []
    real = loader.load_model

    def spy(path: Path | str, **kw: bool) -> loader.LoadedModel:
        loaded.append(Path(path))
        return real(path, **kw)

    monkeypatch.setattr(loader, "load_model", spy)
    steps: list[str] = []
    with pytest.raises(ModelError, match=r"config\.json"):
        load_pair(tiny.target, tmp_path, progress=lambda *a: steps.append(a[2]))
    assert loaded == [] and steps == []  # no weights read, no "Loading …" shown
