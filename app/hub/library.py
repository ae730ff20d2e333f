"""The model library: Tandem's own model folder plus the Hugging Face cache.

Everything here reads metadata only (``config.json``, ``tokenizer_config.json``,
the safetensors headers and ``model.safetensors.index.json``) and builds each
model lazily to match its tensors' names and shapes against the weights (see
:func:`app.engine.loader.check_weights`); weights are never loaded, so scanning
a library of large models stays cheap.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from platformdirs import user_data_dir

from app.engine.loader import (
    TensorInfo,
    check_weights,
    context_length,
    load_json,
    read_config,
    read_error,
    read_header,
    weight_files,
)
from app.errors import ModelError, first_line
from app.hub.tied_output import output_repeats_embedding

Source = Literal["hf-cache", "tandem"]

# Tensors of a quantized layer that hold quantization state, not parameters.
_QUANT_STATE = ("scales", "biases", "global_scale")


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the library knows about one model folder, read without loading weights.

    Attributes:
        name: Display name: the repo id for the Hugging Face cache, else the folder name.
        path: The model folder (for the cache, the snapshot folder).
        source: ``"tandem"`` for Tandem's own folder, ``"hf-cache"`` for the Hub cache.
        repo_id: ``org/name`` on the Hub, when known.
        architecture: The config's ``model_type``.
        parameters: Number of parameters, unpacked for quantized layers.
        quantization: ``(bits, group_size)`` of an MLX-quantized model.
        size_bytes: Bytes on disk, counting the blobs the cache's symlinks point to.
        context_length: The trained context length from the config.
        has_chat_template: Whether the tokenizer has a chat template.
        problem: One-line reason the folder is not a usable model; ``None`` when usable.
        dtype: The unquantized weights' type from the config ("float32", "bfloat16").
    """

    name: str
    path: Path
    source: Source
    repo_id: str | None
    architecture: str | None
    parameters: int | None
    quantization: tuple[int, int] | None
    size_bytes: int
    context_length: int | None
    has_chat_template: bool
    problem: str | None
    dtype: str | None = None

    @property
    def usable(self) -> bool:
        """Whether the folder passed every check."""
        return self.problem is None


def default_models_dir() -> Path:
    """Returns Tandem's own model folder, creating it when missing."""
    path = Path(user_data_dir("Tandem", appauthor=False)) / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def inspect_model(
    path: Path,
    *,
    source: Source = "tandem",
    repo_id: str | None = None,
    name: str | None = None,
) -> ModelInfo:
    """Describes a model folder without loading its weights; never raises.

    Args:
        path: The model folder.
        source: Where the folder lives.
        repo_id: ``org/name`` on the Hub, when known.
        name: Display name; the folder name when omitted.

    Returns:
        The folder's description; ``problem`` says why it is unusable, if it is.
    """
    path = Path(path)
    label = name or path.name or str(path)
    try:
        return _inspect(path, source, repo_id, label)
    except Exception as exc:  # one odd folder must not break a whole library scan
        return ModelInfo(
            name=label,
            path=path,
            source=source,
            repo_id=repo_id,
            architecture=None,
            parameters=None,
            quantization=None,
            size_bytes=0,
            context_length=None,
            has_chat_template=False,
            problem=f"{label}: cannot be read ({first_line(exc)})",
        )


def scan_library(models_dir: Path, hf_cache_dir: Path | None = None) -> list[ModelInfo]:
    """Lists every model in Tandem's folder and in the Hugging Face cache.

    Args:
        models_dir: Tandem's own model folder; each visible subfolder is a model.
        hf_cache_dir: The Hub cache; the default cache when omitted. Each model
            repo contributes its newest snapshot.

    Returns:
        The models sorted by name, unusable ones included with their ``problem``.
    """
    models: list[ModelInfo] = []
    if models_dir.is_dir():
        for folder in models_dir.iterdir():
            if not folder.name.startswith(".") and folder.is_dir():
                models.append(inspect_model(folder, source="tandem"))
    for repo_id, snapshot in _cached_snapshots(hf_cache_dir):
        models.append(inspect_model(snapshot, source="hf-cache", repo_id=repo_id, name=repo_id))
    return sorted(models, key=lambda m: (m.name.casefold(), m.source, str(m.path)))


def delete_model(
    info: ModelInfo,
    *,
    models_dir: Path | None = None,
    hf_cache_dir: Path | None = None,
) -> int:
    """Deletes a model from Tandem's folder or, all revisions at once, from the Hub cache.

    Args:
        info: The model, as :func:`scan_library` described it.
        models_dir: Tandem's own folder; :func:`default_models_dir` when omitted.
        hf_cache_dir: The Hub cache; the default cache when omitted.

    Returns:
        The bytes freed, measured before deleting.

    Raises:
        ValueError: The path lies outside the root its source names.
    """
    if info.source == "hf-cache":
        return _delete_cached(info, hf_cache_dir)
    root = (models_dir or default_models_dir()).resolve()
    # Resolve the parent only, so a symlinked model folder is judged by where its link is.
    folder = Path(os.path.abspath(info.path))
    folder = folder.parent.resolve() / folder.name
    if folder.parent != root or folder.name in ("", ".", ".."):
        raise ValueError(f"{info.path} is not a model in {root}")
    if folder.is_symlink():
        folder.unlink()  # the linked folder is the user's own; only the link goes
        return 0
    if not folder.is_dir():
        raise ValueError(f"{info.path} is not a folder")
    freed = _folder_size(folder, follow_symlinks=False)
    shutil.rmtree(folder)
    return freed


def _inspect(path: Path, source: Source, repo_id: str | None, label: str) -> ModelInfo:
    problem: str | None = None
    try:
        config = read_config(path)
    except ModelError as exc:
        problem = _relabel(str(exc), path, label)
        # Keep what can still be read so the library shows more than the error.
        config = _read_json_or_none(path / "config.json") or {}
    has_chat_template = False
    parameters: int | None = None
    size_bytes = 0
    try:
        tok_config = _read_json_or_none(path / "tokenizer_config.json") or {}
        has_chat_template = _has_chat_template(path, tok_config)
        if path.is_dir():
            size_bytes = _folder_size(path)
            with contextlib.suppress(ModelError):  # read_config said why
                parameters = _count_parameters(path, config.get("quantization"))
        if problem is None:
            # The headers are sound; now the tensors must be the ones the model has.
            check_weights(path, config)
    except ModelError as exc:
        problem = _relabel(str(exc), path, label)
    except OSError as exc:  # a file that cannot be read: permission denied, a link loop
        problem = problem or f"{label}: {read_error(exc)}"
    model_type = config.get("model_type")
    return ModelInfo(
        name=label,
        path=path,
        source=source,
        repo_id=repo_id,
        architecture=str(model_type) if model_type else None,
        parameters=parameters,
        quantization=_quantization(config),
        size_bytes=size_bytes,
        context_length=context_length(config),
        has_chat_template=has_chat_template,
        problem=problem,
        dtype=_dtype(config),
    )


def _dtype(config: dict[str, Any]) -> str | None:
    # Transformers wrote "torch_dtype" until 4.56, "dtype" since.
    dtype = config.get("dtype") or config.get("torch_dtype")
    return dtype if isinstance(dtype, str) and dtype else None


def _relabel(message: str, path: Path, label: str) -> str:
    """Starts a problem with the model's label: a snapshot's repo id, not its commit hash.

    :func:`read_config` names a folder that is missing or no folder by its whole path.
    """
    for prefix in (f"{path}: ", f"{path.name}: "):
        if message.startswith(prefix):
            return f"{label}: {message[len(prefix) :]}"
    return message


def _read_json_or_none(file: Path) -> dict[str, Any] | None:
    # The loader's rule: a FIFO or a link to a device in its place would block the scan.
    try:
        return load_json(file, file.parent.name)
    except (OSError, ModelError):
        return None


def _quantization(config: dict[str, Any]) -> tuple[int, int] | None:
    quant = config.get("quantization")
    if not isinstance(quant, dict):
        return None
    bits, group_size = quant.get("bits"), quant.get("group_size")
    if isinstance(bits, int) and isinstance(group_size, int):
        return bits, group_size
    return None


def _has_chat_template(path: Path, tok_config: dict[str, Any]) -> bool:
    if tok_config.get("chat_template"):
        return True
    return any((path / f).is_file() for f in ("chat_template.jinja", "chat_template.json"))


def _count_parameters(path: Path, quant: Any) -> int:
    """Counts parameters from the headers, unpacking MLX-quantized weights.

    An ``lm_head`` that repeats the embeddings (a tied model's output as GGUF files
    keep it: :mod:`app.hub.tied_output`) is counted once, as the model's makers
    count it: 1.5 B for Qwen2.5-1.5B, not 1.8 B.
    """
    tensors: dict[str, TensorInfo] = {}
    files = weight_files(path)
    for file in files:
        tensors.update(read_header(file))
    # A layer is quantized when it has scales next to its packed uint32 weight.
    quantized = (
        {key.rpartition(".")[0] for key in tensors if key.endswith(".scales")}
        if isinstance(quant, dict)
        else set()
    )
    counts = {key: _tensor_parameters(key, t, quant, quantized) for key, t in tensors.items()}
    total = sum(counts.values())
    head = next((k for k in tensors if k.endswith("lm_head.weight")), None)
    embed = next((k for k in tensors if k.endswith("embed_tokens.weight")), None)
    if head and embed and output_repeats_embedding(files, head, embed):
        total -= counts[head]
    return total


def _tensor_parameters(key: str, tensor: TensorInfo, quant: Any, quantized: set[str]) -> int:
    layer, _, leaf = key.rpartition(".")
    if layer in quantized:
        if leaf in _QUANT_STATE:
            return 0
        bits = _layer_bits(quant, layer)
        if leaf == "weight" and tensor.dtype == "U32" and tensor.shape and bits:
            return math.prod(tensor.shape[:-1]) * (tensor.shape[-1] * 32 // bits)
    return math.prod(tensor.shape)


def _layer_bits(quant: dict[str, Any], layer: str) -> int | None:
    # mlx-lm records per-layer overrides (mixed-precision models) under the layer's path.
    override = quant.get(layer)
    if isinstance(override, dict) and isinstance(override.get("bits"), int):
        return int(override["bits"])
    bits = quant.get("bits")
    return bits if isinstance(bits, int) and bits > 0 else None


def _folder_size(path: Path, *, follow_symlinks: bool = True) -> int:
    """Bytes of the files under ``path``, each inode once.

    With ``follow_symlinks`` a cache snapshot's links count as the blobs they
    point to; without it only files that deleting the folder would free count.
    """
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        for file in files:
            full = os.path.join(root, file)
            if not follow_symlinks and os.path.islink(full):
                continue
            try:
                st = os.stat(full)
            except OSError:
                continue  # a broken link holds nothing
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def _cached_snapshots(hf_cache_dir: Path | None) -> list[tuple[str, Path]]:
    """``(repo_id, newest snapshot folder)`` of every model repo in the Hub cache."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir(hf_cache_dir)
    except (CacheNotFound, OSError, ValueError):
        return []  # no cache yet, or a file where it should be: nothing cached
    found = []
    for repo in cache.repos:
        if repo.repo_type != "model" or not repo.revisions:
            continue
        # The newest revision; on a tie the one refs/main names.
        newest = max(repo.revisions, key=lambda r: (r.last_modified, "main" in r.refs))
        found.append((repo.repo_id, newest.snapshot_path))
    return found


def _delete_cached(info: ModelInfo, hf_cache_dir: Path | None) -> int:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir(hf_cache_dir)
    except (CacheNotFound, OSError, ValueError) as exc:
        raise ValueError(f"{info.path} is not in the Hugging Face cache") from exc
    target = Path(os.path.abspath(info.path))
    target = target.parent.resolve() / target.name
    for repo in cache.repos:
        repo_path = repo.repo_path.resolve()
        if repo.repo_type == "model" and target.is_relative_to(repo_path) and target != repo_path:
            strategy = cache.delete_revisions(*(r.commit_hash for r in repo.revisions))
            freed = int(strategy.expected_freed_size)
            strategy.execute()
            return freed
    raise ValueError(f"{info.path} is not a model in the Hugging Face cache {cache.cache_dir}")


def hub_repo_id(path: Path) -> str | None:
    """The repo id of a Hub cache snapshot folder (``models--org--name/snapshots/<hash>``)."""
    snapshots = path.parent
    repo = snapshots.parent
    if snapshots.name == "snapshots" and repo.name.startswith("models--"):
        return repo.name.removeprefix("models--").replace("--", "/")
    return None


def require_space(folder: Path, needed: int, name: str, need: str = "about {} needed") -> None:
    """Refuses to start writing ``needed`` bytes into ``folder`` when its disk has less free.

    Args:
        folder: An existing folder on the disk that will be written.
        needed: Bytes about to be written.
        name: What is being written, for the message.
        need: How the message words the amount; ``{}`` is the size.

    Raises:
        ModelError: Not enough space; the message gives both numbers.
    """
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return  # cannot tell; a full disk still fails cleanly while writing
    if needed > free:
        raise ModelError(
            f"not enough disk space for {name}: {need.format(human_size(needed))}, "
            f"{human_size(free)} free"
        )


def human_count(n: int) -> str:
    """A count as people read it, in the units of :func:`human_size`: "630.2 M", "7.6 B"."""
    value = float(n)
    for unit in ("", " K", " M"):
        if value < 1000:
            return f"{value:.0f}" if not unit else f"{value:.1f}{unit}"
        value /= 1000
    return f"{value:.1f} B"


def human_size(n: int) -> str:
    """Bytes as people read them (decimal units, as Finder shows)."""
    value = float(n)
    for unit in ("B", "KB", "MB"):
        if value < 1000:
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"
