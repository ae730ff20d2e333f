from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest

from app.hub import ModelInfo, default_models_dir, delete_model, inspect_model, scan_library
from tests.conftest import TinyModels
from tests.fakes import _garbage_header, _truncated_data, _truncated_header, make_cache_repo


def true_parameters(folder: Path) -> int:
    """The parameter count of an unquantized folder, from its actual weights."""
    weights = mx.load(str(folder / "model.safetensors"))
    assert isinstance(weights, dict)
    return sum(v.size for v in weights.values())


def files_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def blobs_size(cache: Path, repo_id: str) -> int:
    blobs = cache / ("models--" + repo_id.replace("/", "--")) / "blobs"
    return sum(f.stat().st_size for f in blobs.iterdir())


def test_good_folder(tiny: TinyModels) -> None:
    info = inspect_model(tiny.target)

    assert info.problem is None and info.usable
    assert info.name == "tiny-llama"
    assert info.path == tiny.target
    assert (info.source, info.repo_id) == ("tandem", None)
    assert info.architecture == "llama"
    assert info.parameters == true_parameters(tiny.target)
    assert info.quantization is None
    assert info.size_bytes == files_size(tiny.target)
    assert info.context_length == 4096
    assert info.has_chat_template


def test_parameters_follow_each_architecture(tiny: TinyModels) -> None:
    info = inspect_model(tiny.draft)

    assert info.architecture == "qwen2"
    assert info.parameters == true_parameters(tiny.draft)
    assert info.parameters < inspect_model(tiny.target).parameters  # type: ignore[operator]


def test_chat_template_from_file(tmp_path: Path, tiny: TinyModels) -> None:
    folder = shutil.copytree(tiny.target, tmp_path / "m")
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    del tok_config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    assert not inspect_model(folder).has_chat_template

    (folder / "chat_template.jinja").write_text("{{ messages }}")
    assert inspect_model(folder).has_chat_template


def test_quantized_model(tmp_path: Path, tiny: TinyModels) -> None:
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes, quantize_model

    config = json.loads((tiny.target / "config.json").read_text())
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    model.load_weights(str(tiny.target / "model.safetensors"))
    model, q_config = quantize_model(model, config, group_size=32, bits=4)
    folder = tmp_path / "tiny-4bit"
    folder.mkdir()
    weights = dict(tree_flatten(model.parameters()))
    assert any(w.dtype == mx.uint32 for w in weights.values())  # really packed
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(q_config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny.target / name, folder)

    info = inspect_model(folder)

    assert info.problem is None
    assert info.quantization == (4, 32)
    assert info.parameters == true_parameters(tiny.target)
    assert info.size_bytes < inspect_model(tiny.target).size_bytes


def test_sharded_weights_with_index(tmp_path: Path, tiny: TinyModels) -> None:
    from tests.corpus import shard

    folder = shutil.copytree(tiny.target, tmp_path / "sharded")
    weight_map = shard(folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    assert inspect_model(folder).parameters == true_parameters(tiny.target)

    (folder / "model-00002-of-00002.safetensors").unlink()
    assert "model-00002-of-00002.safetensors is missing" in str(inspect_model(folder).problem)


def _short_file(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"\x01\x02")


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: (d / "config.json").unlink(), "no config.json"),
        (lambda d: (d / "config.json").write_text("{"), "config.json is unreadable"),
        (
            lambda d: (d / "config.json").write_text(json.dumps({"model_type": "nope"})),
            "architecture 'nope' is not supported",
        ),
        (lambda d: (d / "model.safetensors").unlink(), "no .safetensors weights"),
        (lambda d: (d / "tokenizer.json").unlink(), "no tokenizer"),
        (lambda d: (d / "tokenizer_config.json").write_text("["), "tokenizer_config.json"),
        (_truncated_header, "model.safetensors is truncated (header of 5000 bytes"),
        (_truncated_data, "model.safetensors is truncated"),
        (_short_file, "model.safetensors is truncated (no header)"),
        (_garbage_header, "model.safetensors has an unreadable header"),
    ],
    ids=[
        "no-config",
        "bad-json",
        "unknown-type",
        "no-weights",
        "no-tokenizer",
        "bad-tokenizer-config",
        "truncated-header",
        "truncated-data",
        "short-file",
        "garbage-header",
    ],
)
def test_broken_folder_gets_a_problem(
    tmp_path: Path, tiny: TinyModels, mutate: Callable[[Path], object], reason: str
) -> None:
    folder = shutil.copytree(tiny.target, tmp_path / "broken")
    mutate(folder)

    info = inspect_model(folder)

    assert info.problem is not None and not info.usable
    assert reason in info.problem
    assert info.problem.startswith("broken: ")
    assert "\n" not in info.problem
    assert info.size_bytes == files_size(folder)


def test_broken_folder_keeps_what_it_can_read(tmp_path: Path, tiny: TinyModels) -> None:
    folder = shutil.copytree(tiny.target, tmp_path / "m")
    _truncated_data(folder)

    info = inspect_model(folder)

    assert info.problem is not None
    assert (info.architecture, info.context_length) == ("llama", 4096)


def test_missing_path_and_file(tmp_path: Path) -> None:
    assert "no such folder" in str(inspect_model(tmp_path / "absent").problem)
    file = tmp_path / "weights.bin"
    file.write_bytes(b"x")
    info = inspect_model(file)
    assert "not a folder" in str(info.problem)
    assert info.size_bytes == 0


def test_scan_library_finds_both_sources(tmp_path: Path, tiny: TinyModels) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copytree(tiny.target, models / "Zeta")
    shutil.copytree(tiny.draft, models / "alpha")
    shutil.copytree(tiny.target, models / ".partial")  # hidden: a download in progress
    (models / "notes.txt").write_text("not a model")
    (models / "empty").mkdir()
    cache = tmp_path / "hub"
    snapshot = make_cache_repo(cache, "org/name", tiny.draft)
    (cache / "datasets--org--data" / "snapshots" / ("b" * 40)).mkdir(parents=True)

    found = scan_library(models, cache)

    assert [m.name for m in found] == ["alpha", "empty", "org/name", "Zeta"]
    hub = found[2]
    assert (hub.source, hub.repo_id) == ("hf-cache", "org/name")
    assert hub.path == snapshot.resolve()
    assert hub.problem is None
    assert hub.parameters == true_parameters(tiny.draft)
    assert hub.size_bytes == blobs_size(cache, "org/name")
    assert found[1].problem == "empty: no config.json, so this is not a model folder"
    assert {m.source for m in found if m.name != "org/name"} == {"tandem"}


def test_scan_library_takes_the_newest_snapshot(tmp_path: Path, tiny: TinyModels) -> None:
    cache = tmp_path / "hub"
    old = make_cache_repo(cache, "org/name", tiny.draft, "1" * 40, ref=None)
    new = make_cache_repo(cache, "org/name", tiny.target, "2" * 40)
    for link in old.iterdir():
        os.utime(link.resolve(), (1_000_000, 1_000_000))

    (found,) = scan_library(tmp_path / "no-models", cache)

    assert found.path == new.resolve()
    assert found.architecture == "llama"


def test_scan_library_without_a_cache(tmp_path: Path, tiny: TinyModels) -> None:
    models = tmp_path / "models"
    shutil.copytree(tiny.target, models / "m")

    assert [m.name for m in scan_library(models, tmp_path / "no-cache")] == ["m"]
    assert scan_library(tmp_path / "absent", tmp_path / "no-cache") == []


def test_cache_snapshot_problems_name_the_repo(tmp_path: Path, tiny: TinyModels) -> None:
    source = shutil.copytree(tiny.target, tmp_path / "src")
    (source / "model.safetensors").unlink()
    cache = tmp_path / "hub"
    make_cache_repo(cache, "org/broken", source)

    (found,) = scan_library(tmp_path / "no-models", cache)

    assert found.problem == "org/broken: no .safetensors weights"


def test_delete_tandem_model(tmp_path: Path, tiny: TinyModels) -> None:
    models = tmp_path / "models"
    folder = shutil.copytree(tiny.target, models / "m")
    expected = files_size(folder)
    (info,) = scan_library(models, tmp_path / "no-cache")

    assert delete_model(info, models_dir=models) == expected
    assert not folder.exists()
    assert models.is_dir()


def test_delete_symlinked_tandem_model_keeps_its_target(tmp_path: Path, tiny: TinyModels) -> None:
    models = tmp_path / "models"
    models.mkdir()
    elsewhere = shutil.copytree(tiny.target, tmp_path / "mine")
    (models / "linked").symlink_to(elsewhere, target_is_directory=True)
    (info,) = scan_library(models, tmp_path / "no-cache")

    assert delete_model(info, models_dir=models) == 0
    assert not (models / "linked").exists()
    assert (elsewhere / "model.safetensors").is_file()


def test_delete_cached_model(tmp_path: Path, tiny: TinyModels) -> None:
    cache = tmp_path / "hub"
    make_cache_repo(cache, "org/name", tiny.draft, "1" * 40, ref=None)
    make_cache_repo(cache, "org/name", tiny.target, "2" * 40)
    make_cache_repo(cache, "org/other", tiny.draft)
    expected = blobs_size(cache, "org/name")
    found = scan_library(tmp_path / "no-models", cache)
    info = next(m for m in found if m.repo_id == "org/name")

    assert delete_model(info, hf_cache_dir=cache) == expected
    assert not (cache / "models--org--name").exists()
    assert [m.repo_id for m in scan_library(tmp_path / "no-models", cache)] == ["org/other"]


def test_delete_refuses_paths_outside_the_roots(tmp_path: Path, tiny: TinyModels) -> None:
    models, cache = tmp_path / "models", tmp_path / "hub"
    models.mkdir()
    make_cache_repo(cache, "org/name", tiny.draft)
    outside = shutil.copytree(tiny.target, tmp_path / "outside")
    info = inspect_model(outside)

    with pytest.raises(ValueError, match="is not a model in"):
        delete_model(info, models_dir=models)
    with pytest.raises(ValueError, match="Hugging Face cache"):
        delete_model(_as_cached(info), hf_cache_dir=cache)
    with pytest.raises(ValueError):
        delete_model(_with_path(info, models / ".." / "outside"), models_dir=models)
    assert (outside / "model.safetensors").is_file()


def _as_cached(info: ModelInfo) -> ModelInfo:
    from dataclasses import replace

    return replace(info, source="hf-cache", repo_id="org/name")


def _with_path(info: ModelInfo, path: Path) -> ModelInfo:
    from dataclasses import replace

    return replace(info, path=path)


def test_default_models_dir() -> None:
    folder = default_models_dir()

    assert folder.is_dir()
    assert folder.parts[-2:] == ("Tandem", "models")
    assert folder.is_relative_to(Path(os.environ["XDG_DATA_HOME"]))
