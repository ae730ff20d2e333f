"""Files and folders: the hidden partial folder, its move into place, and write errors."""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.errors import ModelError, first_line
from app.files import is_plain_name


def model_folder(models_dir: Path, name: str) -> Path:
    """The folder a model named ``name`` is imported into: in ``models_dir``, never elsewhere.

    Raises:
        ModelError: ``name`` is not a plain folder name (it has a separator, is
            absolute, ``.`` or ``..``) or is hidden (the library skips those).
    """
    if not is_plain_name(name) or name.startswith("."):
        raise ModelError(
            f"the name must be a plain folder name (no '/', not hidden, not '.' or '..'), "
            f"not {name!r}"
        )
    return Path(models_dir) / name


def _refuse_existing(target: Path) -> None:
    if target.exists() or target.is_symlink():
        raise ModelError(f"{target.name} already exists in {target.parent}")


@contextmanager
def _partial_folder(target: Path) -> Iterator[Path]:
    """A hidden sibling of ``target`` to write into; removed unless renamed into place.

    Also turns write errors into :class:`ModelError` with a one-line reason.
    """
    path = target.parent / f".{target.name}.partial-{secrets.token_hex(4)}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
        yield path
    except OSError as exc:
        raise _write_error(exc, target) from exc
    finally:
        if path.exists() or path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _linked_folders(folder: str, names: list[str]) -> set[str]:
    """Links to folders, which a copy skips: one that points up the tree would never end."""
    paths = {name: os.path.join(folder, name) for name in names}
    return {name for name, p in paths.items() if os.path.islink(p) and os.path.isdir(p)}


def _write_error(exc: OSError, target: Path) -> ModelError:
    if exc.errno == errno.ENOSPC:
        return ModelError(f"not enough disk space to write {target.name} in {target.parent}")
    return ModelError(f"cannot write {target.name} ({first_line(exc)})")


def _move_into_place(partial: Path, target: Path) -> None:
    # rename() would replace an empty folder that appeared meanwhile; refuse instead.
    _refuse_existing(target)
    os.rename(partial, target)


def _tree_size(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for file in files:
            try:
                total += os.stat(os.path.join(root, file)).st_size
            except OSError:
                continue
    return total


def _write_json(file: Path, data: Any) -> None:
    file.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
