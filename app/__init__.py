"""Tandem: private local LLM chat with speculative decoding."""

import os
import sys
from pathlib import Path

from app import backend_env

__version__ = "0.1.0"

# Before any module of the app imports MLX, which may read them as it starts its GPU.
backend_env.apply_defaults()


def resource_path(name: str) -> Path:
    """Path of a file in ``resources/``, in a checkout or inside Tandem.app."""
    bundle = os.environ.get("RESOURCEPATH") if getattr(sys, "frozen", False) else None
    base = Path(bundle) if bundle else Path(__file__).resolve().parent.parent / "resources"
    return base / name
