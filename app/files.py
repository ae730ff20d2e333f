"""Writing files so that a crash or a full disk never leaves half of one."""

from __future__ import annotations

import json
import os
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
