from __future__ import annotations

from pathlib import Path
from typing import Any

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


def test_the_pair_check_given_judges_the_pair_before_any_weight_is_read(
    tiny: TinyModels,
) -> None:
    seen: list[tuple[Path, Path]] = []
    steps: list[str] = []

    def refuse(target: Path, draft: Path) -> None:
        seen.append((target, draft))
        raise IncompatiblePairError("tiny-foreign cannot draft for tiny-llama: no")

    with pytest.raises(IncompatiblePairError, match=r"^tiny-foreign cannot draft for tiny-llama"):
        load_pair(tiny.target, tiny.foreign, check=refuse, progress=lambda p: steps.append(p.text))
    assert seen == [(tiny.target, tiny.foreign)]  # the folders as given, for the same names
    assert steps == ["Checking the pair"]  # refused before either model's weights were read


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

    def spy(path: Path | str, **kw: Any) -> loader.LoadedModel:
        loaded.append(Path(path))
        return real(path, **kw)

    monkeypatch.setattr(loader, "load_model", spy)
    steps: list[str] = []
    with pytest.raises(ModelError, match=r"config\.json"):
        load_pair(tiny.target, tmp_path, progress=lambda p: steps.append(p.text))
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
        tiny.target, tiny.noisy, loaded=first, progress=lambda p: steps.append(p.text)
    )
    assert second.target is first.target  # the same arrays: only the new draft was read
    assert second.draft is not first.draft
    assert reads == [tiny.noisy.resolve()]
    assert steps[1] == "Keeping tiny-llama, loaded already"  # after the pair check
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


def test_loading_reports_the_bytes_of_weights_read_per_model(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.engine import loader

    monkeypatch.setattr(loader, "_MIN_GROUP_BYTES", 1)  # a hundredth of a tiny model a group
    seen: list[loader.LoadProgress] = []
    pair = load_pair(tiny.target, tiny.draft, progress=seen.append)
    assert pair.draft is not None
    for step, folder in ((1, tiny.target), (2, tiny.draft)):
        reads = [p for p in seen if p.step == step]
        assert reads[0] == loader.LoadProgress(step, 3, f"Loading {folder.name}")
        total = reads[1].total
        weights = sum(f.stat().st_size for f in loader.weight_files(folder))
        assert 0.9 * weights < total <= weights  # the weights' size, less the headers
        done = [p.done for p in reads[1:]]
        assert done[0] == 0 and done[-1] == total and done == sorted(done) and len(done) > 5
        assert all(p.total == total and p.text == f"Loading {folder.name}" for p in reads[1:])
        # Once some is read, the rest is estimated; once all is, nothing is left to estimate.
        assert all(p.seconds_left is not None and p.seconds_left >= 0 for p in reads[2:-1])
        assert reads[-1].seconds_left is None
    fractions = [p.fraction for p in seen]
    assert fractions == sorted(fractions) and seen[0] == loader.LoadProgress(
        0, 3, "Checking the pair"
    )


def test_a_model_type_transformers_lacks_loads_without_its_warning(
    tiny: TinyModels, tmp_path: Path
) -> None:
    import logging

    from app.testing.tiny import build_model
    from tests.engine.families import window_config

    folder = build_model(tmp_path / "v4", window_config("deepseek_v41"), tokenizer_from=tiny.target)
    said: list[logging.LogRecord] = []

    class Heard(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record)

    handler = Heard()
    logger = logging.getLogger("transformers.configuration_utils")
    logger.addHandler(handler)
    try:
        load_model(folder)
    finally:
        logger.removeHandler(handler)
    assert not [r for r in said if "deepseek_v41" in r.getMessage()]
