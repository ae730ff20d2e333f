"""Importing models into Tandem's folder: GGUF files converted to MLX, and MLX folders.

A GGUF file (llama.cpp's format) holds the weights, often quantized, plus the
config and tokenizer as metadata. :func:`import_gguf` dequantizes every tensor
with the ``gguf`` package's numpy code, renames it to the Hugging Face layout
that mlx-lm loads, undoes llama.cpp's own weight edits, rebuilds
``tokenizer.json`` from the metadata and optionally re-quantizes with MLX.

Both importers write into a hidden sibling folder and rename it into place at
the end, so a failed, cancelled or crashed import never leaves a half-written
model where the library would find it.

The steps live in modules of their own: :mod:`.convert` (GGUF tensors and
metadata to the Hugging Face layout), :mod:`.hybrid` (what the Gated DeltaNet
families, Qwen3.5 and Qwen3-Next, and Qwen3.5's MTP layers add to that),
:mod:`.tokenizer` (``tokenizer.json`` from the metadata), :mod:`.quantize`
(re-quantization with MLX),
:mod:`.shards` (safetensors writing), :mod:`.files` (the hidden folder and its
move into place) and :mod:`.common` (what they share).
"""

from __future__ import annotations

import math
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from app.engine.loader import (
    check_weights,
    quantization_of,
    read_config,
    read_header,
    user_path,
    weight_files,
)
from app.errors import ModelError
from app.hub.gguf_import.common import _DTYPES, ImportCancelled, ImportProgress, _check_cancel
from app.hub.gguf_import.convert import _convert, holds_only_a_head
from app.hub.gguf_import.files import (
    _linked_folders,
    _move_into_place,
    _partial_folder,
    _refuse_existing,
    _tree_size,
    _write_error,
    _write_json,
    model_folder,
)
from app.hub.gguf_import.quantize import _quantize
from app.hub.library import require_space

__all__ = [
    "ImportCancelled",
    "ImportProgress",
    "default_q_bits",
    "folder_quantization",
    "import_folder",
    "import_gguf",
    "model_and_head",
    "model_folder",
    "quantization_of",
]


def import_gguf(
    gguf_path: Path,
    out_dir: Path,
    *,
    q_bits: int | None = None,
    dtype: str = "float32",
    mtp: Path | None = None,
    progress: Callable[[ImportProgress], None] | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Converts a GGUF file into an MLX model folder in the Hugging Face layout.

    Args:
        gguf_path: The ``.gguf`` file; split files must be merged first.
        out_dir: The model folder to create; must not exist yet.
        mtp: A file of the model's MTP head alone (llama.cpp's ``--mtp`` writes one
            beside a model converted ``--no-mtp``), imported into the folder with it.
        q_bits: 4 or 8 to re-quantize with MLX (group size 64); ``None`` keeps
            the dequantized weights.
        dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"``: the weights'
            type, and the type of the scales of a quantized model.
        progress: Called on the calling thread as the import advances.
        cancel: Checked between tensors; once set the import stops.

    Returns:
        ``out_dir``.

    Raises:
        ModelError: The file cannot be imported or written, with a one-line reason.
        ImportCancelled: ``cancel`` was set; nothing was left behind.
        ValueError: ``q_bits`` or ``dtype`` is not one of the values above.
    """
    if q_bits not in (None, 4, 8):
        raise ValueError(f"q_bits must be None, 4 or 8, not {q_bits!r}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, not {dtype!r}")
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    model_folder(out_dir.parent, out_dir.name)  # a plain name: ".." would write elsewhere
    _refuse_existing(out_dir)
    report = progress or (lambda _p: None)
    with _partial_folder(out_dir) as partial:
        mtp_path = None if mtp is None else Path(user_path(mtp))
        _convert(gguf_path, partial, out_dir.name, q_bits, dtype, report, cancel, mtp_path)
        _check_cancel(cancel)
        report(ImportProgress("writing", 0, 1))
        _move_into_place(partial, out_dir)
        report(ImportProgress("writing", 1, 1))
    return out_dir


def import_folder(
    src: Path,
    models_dir: Path,
    *,
    link: bool = False,
    name: str | None = None,
    q_bits: int | None = None,
    progress: Callable[[ImportProgress], None] | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Imports a model folder into ``models_dir``, under ``name`` or its own.

    Args:
        src: The model folder (MLX's, or a Hugging Face checkpoint mlx-lm
            loads); validated with :func:`read_config` and
            :func:`check_weights` first.
        models_dir: Tandem's model folder.
        link: Symlink to ``src`` instead of copying it (the folder must then stay put).
        name: The folder name in ``models_dir``; ``src``'s own when omitted (with
            ``-4bit`` or ``-8bit`` where quantized).
        q_bits: 4 or 8 to quantize the folder's weights with MLX (group size 64),
            its MTP head with them (mlx-lm's own converter drops it); ``None``
            copies them as they are.
        progress: Called on the calling thread as a quantization advances.
        cancel: Checked between the quantized weights' files; once set the import stops.

    Returns:
        The new folder (or link) in ``models_dir``.

    Raises:
        ModelError: ``src`` is not a usable model folder, is already quantized
            where ``q_bits`` asks to quantize it, the name is no plain folder
            name or is taken, or the copy failed, with a one-line reason.
        ImportCancelled: ``cancel`` was set; nothing was left behind.
        ValueError: ``q_bits`` is not one of the values above, or is given with ``link``.
    """
    if q_bits not in (None, 4, 8):
        raise ValueError(f"q_bits must be None, 4 or 8, not {q_bits!r}")
    if q_bits is not None and link:
        raise ValueError("a linked folder is used as it is: it cannot be quantized")
    src = Path(os.path.abspath(user_path(src)))
    default = src.name + (f"-{q_bits}bit" if q_bits else "")
    target = model_folder(models_dir, name if name is not None else default)
    config = read_config(src)
    check_weights(src, config)
    held = quantization_of(config)
    if q_bits is not None and held is not None:
        raise ModelError(f"{src.name} is already quantized ({held}); import it as it is")
    _refuse_existing(target)
    if link:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(src.resolve(), target_is_directory=True)
        except OSError as exc:
            raise _write_error(exc, target) from exc
        return target
    with _partial_folder(target) as partial:
        if q_bits is None:
            require_space(target.parent, _tree_size(src), src.name)
            partial.rmdir()  # copytree creates the folder itself
            # Follow file links: a Hub cache snapshot links to blobs that must be copied.
            shutil.copytree(src, partial, ignore=_linked_folders, ignore_dangling_symlinks=True)
        else:
            require_space(target.parent, _quantized_size(src, q_bits), target.name)
            report = progress or (lambda _p: None)
            config = _quantize(src, partial, config, q_bits, report, cancel)
            _write_json(partial / "config.json", config)
            _copy_beside_weights(src, partial)
            _check_cancel(cancel)
        _move_into_place(partial, target)
    return target


def model_and_head(first: Path, second: Path) -> tuple[Path, Path]:
    """Two GGUF files, a model's and its MTP head's alone, in either order: the model's first."""
    return (second, first) if holds_only_a_head(Path(first)) else (first, second)


def default_q_bits(gpu: bool) -> int | None:
    """How an import is stored unless asked otherwise: 4-bit where MLX computes on a GPU;
    as it is on MLX's CPU backend, where 4-bit products are slower than float32 ones."""
    return 4 if gpu else None


def folder_quantization(src: Path) -> str | None:
    """:func:`quantization_of` a folder's config; ``None`` where it has none to read."""
    try:
        return quantization_of(read_config(Path(src)))
    except ModelError:
        return None


# What a weights file's name ends with: a quantized folder writes its own.
_WEIGHTS = (".safetensors", ".index.json", ".bin", ".pt", ".pth", ".npz", ".gguf")


def _quantized_size(src: Path, q_bits: int) -> int:
    """About what ``src``'s weights take quantized: ``q_bits`` a weight, 1 for its scales."""
    weights = sum(math.prod(t.shape) for f in weight_files(src) for t in read_header(f).values())
    return weights * (q_bits + 1) // 8


def _copy_beside_weights(src: Path, out: Path) -> None:
    """Copies ``src``'s own files but its weights and config: the tokenizer, the chat
    template, the generation config, its license (a link is followed to its file)."""
    for path in sorted(src.iterdir()):
        if path.name == "config.json" or path.name.endswith(_WEIGHTS) or not path.is_file():
            continue
        shutil.copyfile(path, out / path.name)
