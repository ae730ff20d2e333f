"""Named sets of sampling settings and a system prompt, built in or the user's own.

The user's presets live in ``presets.json`` in the data folder, written
atomically; the built-in ones are never stored and cannot be removed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from app.engine.types import Sampling
from app.files import write_atomic
from app.store.db import default_data_dir
from app.store.settings import read_drafting

FILE_VERSION = 1
MAX_NAME_LENGTH = 60


@dataclass(frozen=True, slots=True, kw_only=True)
class Preset(Sampling):
    """A named system prompt and the :class:`Sampling` it applies.

    Attributes:
        name: Unique among presets; built-in names are reserved.
        system_prompt: Given to new conversations; ``""`` for none.
    """

    name: str = field(kw_only=False)
    system_prompt: str = field(default="", kw_only=False)

    def validated(self) -> Preset:
        """This preset with its name stripped, once the name is checked (the
        sampling fields are checked as any :class:`Sampling` is made).

        Raises:
            ValueError: The name is empty, too long or more than one line.
        """
        name = self.name.strip()
        if not name or len(name) > MAX_NAME_LENGTH or "\n" in name:
            raise ValueError(f"name must be one line of 1 to {MAX_NAME_LENGTH} characters")
        return self if name == self.name else replace(self, name=name)


BUILTIN_PRESETS: tuple[Preset, ...] = (
    Preset("Balanced"),
    Preset("Precise", temperature=0.0, top_p=1.0),
    Preset("Creative", temperature=0.9, top_p=0.95),
    Preset(
        "Code",
        system_prompt=(
            "You are an expert programmer. Answer with correct, idiomatic code in fenced "
            "blocks that name the language, and keep explanations short."
        ),
        temperature=0.0,
        prompt_lookup=True,  # code repeats the prompt's names, which lookup drafts for free
    ),
)
_BUILTIN_NAMES = frozenset(p.name for p in BUILTIN_PRESETS)


def is_builtin(name: str) -> bool:
    return name in _BUILTIN_NAMES


def upsert(presets: list[Preset], preset: Preset) -> list[Preset]:
    """``presets`` with ``preset`` in place of the one of its name, or added at the end.

    Raises:
        ValueError: The preset is out of range, or has a built-in name.
    """
    preset = preset.validated()
    if is_builtin(preset.name):
        raise ValueError(f"{preset.name!r} is built in; save it under another name")
    if any(p.name == preset.name for p in presets):
        return [preset if p.name == preset.name else p for p in presets]
    return [*presets, preset]


def remove(presets: list[Preset], name: str) -> list[Preset]:
    """``presets`` without the one called ``name`` (unchanged when there is none).

    Raises:
        ValueError: ``name`` is a built-in preset.
    """
    if is_builtin(name):
        raise ValueError(f"{name!r} is built in and cannot be removed")
    return [p for p in presets if p.name != name]


def _fits(value: Any, default: Any) -> bool:
    """Whether a loaded value has the type of its default."""
    if isinstance(value, bool) or isinstance(default, bool):
        return type(value) is type(default)
    if default is None:  # only seed defaults to None
        return value is None or isinstance(value, int)
    if isinstance(default, float):
        return isinstance(value, int | float)
    return isinstance(value, type(default))


def _read(entry: Any) -> Preset | None:
    """A preset from its JSON object, or ``None`` when it is malformed."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        return None
    defaults = Preset("")
    clean: dict[str, Any] = {}
    if "drafting" in entry or "num_draft" in entry or "auto_draft" in entry:
        drafting = read_drafting(entry)
        if drafting is None:
            return None
        clean["drafting"] = drafting
    for f in fields(Preset):
        if f.name not in entry or f.name == "drafting":
            continue
        value = entry[f.name]
        if not _fits(value, getattr(defaults, f.name)):
            return None
        clean[f.name] = float(value) if isinstance(getattr(defaults, f.name), float) else value
    try:
        return Preset(**clean).validated()
    except ValueError:
        return None


class PresetsFile:
    """Loads and saves the user's presets as JSON, next to the built-in ones."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_data_dir() / "presets.json"

    def load(self) -> list[Preset]:
        """The built-in presets, then the user's.

        A missing or unreadable file gives the built-ins; malformed entries, and
        ones named like a built-in or an earlier entry, are dropped.
        """
        presets = list(BUILTIN_PRESETS)
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return presets
        entries = data.get("presets") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            return presets
        names = set(_BUILTIN_NAMES)
        for entry in entries:
            preset = _read(entry)
            if preset is not None and preset.name not in names:
                names.add(preset.name)
                presets.append(preset)
        return presets

    def save(self, user_presets: list[Preset]) -> None:
        """Writes the user's presets; built-in ones in the list are left out."""
        mine = [asdict(p) for p in user_presets if not is_builtin(p.name)]
        data = {"version": FILE_VERSION, "presets": mine}
        write_atomic(self.path, json.dumps(data, indent=2, ensure_ascii=False).encode())
