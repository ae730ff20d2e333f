"""Model library, pair checks, imports and (later) Hub downloads; free of Qt.

``app.hub.gguf_import`` is imported on use: it pulls in the ``gguf`` package.
"""

from app.hub.library import (
    ModelInfo,
    Source,
    default_models_dir,
    delete_model,
    human_count,
    human_size,
    inspect_model,
    scan_library,
)
from app.hub.pair_check import (
    Check,
    Verdict,
    check_pair,
    format_verdict,
    load_checked_pair,
    refusal,
    require_compatible,
)

__all__ = [
    "Check",
    "ModelInfo",
    "Source",
    "Verdict",
    "check_pair",
    "default_models_dir",
    "delete_model",
    "format_verdict",
    "human_count",
    "human_size",
    "inspect_model",
    "load_checked_pair",
    "refusal",
    "require_compatible",
    "scan_library",
]
