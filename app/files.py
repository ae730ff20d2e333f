"""Writing files so that a crash or a full disk never leaves half of one."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` so that readers see the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_entries(path: Path, version: int, section: str) -> dict[str, Any]:
    """The ``section`` object of a versioned JSON file that :func:`write_entries` wrote.

    A missing, unreadable or other-version file reads as empty.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != version:
        return {}
    entries = data.get(section)
    return entries if isinstance(entries, dict) else {}


def write_entries(path: Path, version: int, section: str, entries: dict[str, Any]) -> None:
    """Writes ``entries`` as the ``section`` of a versioned JSON file, atomically."""
    data = {"version": version, section: entries}
    write_atomic(path, json.dumps(data, indent=1).encode("utf-8"))


def folder_problem(path: Path) -> str | None:
    """Why ``path`` can be no folder to write in, or ``None`` when it is one or can be made.

    Only what no retry mends counts: ``path``, or the nearest of its parents
    that exists, is not a folder. A read-only or full disk shows when writing.
    """
    for part in (path, *path.parents):
        try:
            mode = part.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue  # not there yet: a parent decides
        except OSError as exc:
            return f"{path}: {exc.strerror or exc}"
        if stat.S_ISDIR(mode):
            return None
        return f"{path} is not a folder" if part == path else f"{path}: {part} is not a folder"
    return None


def is_plain_name(name: str) -> bool:
    """Whether ``name`` names an entry of a folder itself: not empty, no separator, not . or .."""
    return bool(name) and "\0" not in name and Path(name).name == name and name not in (".", "..")


def not_regular(file: Path) -> str | None:
    """Why ``file`` cannot be read as a file; ``None`` for a file, a link to one, or nothing.

    A FIFO blocks a read forever and a device such as ``/dev/zero`` never ends one.
    """
    if file.is_file():
        return None
    if file.is_dir():
        return "is a folder, not a file"
    if file.exists():
        return "is not a regular file (a device, FIFO or socket)"
    if file.is_symlink():
        return "is a broken or looping symbolic link"
    return None


def write_problem(path: Path) -> str | None:
    """Why ``path`` is no file to write (replace) atomically, or ``None``.

    A link is refused rather than replaced (or followed to a device), as are a
    folder and anything not a regular file; so is a parent that is not a folder.
    """
    if path.is_symlink():
        return f"{path} is a symbolic link; give the file itself"
    if (problem := not_regular(path)) is not None:
        return f"{path} {problem}"
    return folder_problem(path.parent)
