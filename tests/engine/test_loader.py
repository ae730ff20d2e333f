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


def _weight_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The folders whose weights mlx-lm reads from now on."""
    import mlx_lm.utils

    reads: list[Path] = []
    real = mlx_lm.utils.load

    def spy(path: str, *args: object, **kw: object) -> object:
        reads.append(Path(path))
        return real(path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(mlx_lm.utils, "load", spy)
    return reads


def test_a_model_already_loaded_is_kept_when_only_the_other_changes(
    tiny: TinyModels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = load_pair(tiny.target, tiny.draft)
    reads = _weight_reads(monkeypatch)
    steps: list[str] = []
    second = load_pair(
        tiny.target, tiny.noisy, loaded=first, progress=lambda *a: steps.append(a[2])
    )
    assert second.target is first.target  # the same arrays: only the new draft was read
    assert second.draft is not first.draft
    assert reads == [tiny.noisy.resolve()]
    assert steps[0] == "Keeping tiny-llama, loaded already"
    # Only the target changes; the draft, named through a link, is the same folder.
    link = tmp_path / "noisy-link"
    link.symlink_to(tiny.noisy, target_is_directory=True)
    third = load_pair(tiny.copy, link, loaded=second)
    assert third.draft is second.draft and third.target is not second.target
    assert reads == [tiny.noisy.resolve(), tiny.copy.resolve()]


def test_a_model_is_read_again_when_it_loads_otherwise_or_its_folder_changed(
    tiny: TinyModels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import shutil

    folder = Path(shutil.copytree(tiny.target, tmp_path / "model"))
    first = load_pair(folder)
    reads = _weight_reads(monkeypatch)
    assert load_pair(folder, fuse=False, loaded=first).target is not first.target
    weights = next(folder.glob("model*.safetensors"))
    os.utime(weights, ns=(1, 1))  # a download or import that replaced the file
    assert load_pair(folder, loaded=first).target is not first.target
    assert len(reads) == 2
