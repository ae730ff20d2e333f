"""Tandem: private local LLM chat with speculative decoding."""

import os
import sys
from pathlib import Path

__version__ = "0.1.0"


def resource_path(name: str) -> Path:
    """Path of a file in ``resources/``, in a checkout or inside Tandem.app."""
    bundle = os.environ.get("RESOURCEPATH") if getattr(sys, "frozen", False) else None
    base = Path(bundle) if bundle else Path(__file__).resolve().parent.parent / "resources"
    return base / name
