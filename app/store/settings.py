"""User preferences in a JSON file, written atomically."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from app.engine.types import PARAM_RANGES, DraftSetting, Sampling
from app.files import write_atomic
from app.store.db import default_data_dir


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings(Sampling):
    """Preferences that outlive a session: the window's :class:`Sampling` and the rest."""

    target: str | None = None
    draft: str | None = None
    colour_tokens: bool = True
    show_speculation_panel: bool = True
    # The local OpenAI-compatible server (off by default); its API key lives in the keychain.
    server_enabled: bool = False
    server_host: str = "127.0.0.1"
    server_port: int = 8080
    # Web origins besides loopback ones that may call the server, comma-separated.
    server_cors_origins: str = ""
    # The fastest fixed k a calibration found, per "target|draft".
    best_k: dict[str, int] = field(default_factory=dict)

    def updated(self, **changes: Any) -> Settings:
        return replace(self, **changes)


_OPTIONAL_INTS = {"seed"}


def read_drafting(entry: dict[str, Any]) -> DraftSetting | None:
    """The draft setting of a settings or preset JSON object; ``None`` where it has none
    or a malformed one. A file from before the one setting holds ``num_draft`` (the
    slider's k) and ``auto_draft``: it reads the same."""
    value = entry.get("drafting")
    if value is None and ("num_draft" in entry or "auto_draft" in entry):
        default = DraftSetting()
        value = {
            "k": entry.get("num_draft", default.k),
            "auto": entry.get("auto_draft", default.auto),
        }
    if not isinstance(value, dict) or not set(value) <= {"k", "auto", "limit"}:
        return None
    try:
        return DraftSetting(**value)
    except ValueError:
        return None


def _fits(name: str, value: Any, default: Any) -> bool:
    """Whether a loaded value has the type of its default (a bad one is dropped).

    A sampling field must be in its range too, so the window never builds
    ``GenerationParams`` that refuse it.
    """
    if isinstance(default, DraftSetting):
        return False  # read apart (read_drafting)
    if name in PARAM_RANGES:
        return PARAM_RANGES[name].holds(value) and (value is not None or default is None)
    if name in _OPTIONAL_INTS:
        return value is None or type(value) is int
    if isinstance(value, bool) or isinstance(default, bool):
        return type(value) is type(default)
    if default is None:
        return value is None or isinstance(value, str)
    if isinstance(default, float):
        return isinstance(value, int | float)
    if isinstance(default, dict):
        return isinstance(value, dict) and all(
            isinstance(k, str) and type(v) is int and v >= 0 for k, v in value.items()
        )
    return isinstance(value, type(default))


def origins(text: str) -> tuple[str, ...]:
    """The origins of :attr:`Settings.server_cors_origins`, in order, without blanks."""
    return tuple(o.strip() for o in text.split(",") if o.strip())


def pair_key(target: str, draft: str | None) -> str:
    """The key of a pair in :attr:`Settings.best_k`."""
    return f"{target}|{draft or ''}"


class SettingsFile:
    """Loads and saves :class:`Settings` as JSON."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_data_dir() / "settings.json"

    def load(self) -> Settings:
        """The saved settings; defaults when the file is missing or unreadable."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return Settings()
        if not isinstance(data, dict):
            return Settings()
        defaults = Settings()
        clean: dict[str, Any] = {}
        for f in fields(Settings):
            if f.name in data and _fits(f.name, data[f.name], getattr(defaults, f.name)):
                clean[f.name] = data[f.name]
        drafting = read_drafting(data)
        if drafting is not None:
            clean["drafting"] = drafting
        return Settings(**clean)

    def save(self, settings: Settings) -> None:
        write_atomic(self.path, json.dumps(asdict(settings), indent=2).encode())
