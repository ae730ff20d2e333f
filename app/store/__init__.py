"""Persistence of conversations, free of Qt."""

from app.files import write_atomic
from app.store.db import (
    Conversation,
    SearchHit,
    Store,
    StoreChange,
    StoredMessage,
    default_data_dir,
)
from app.store.presets import (
    BUILTIN_PRESETS,
    Preset,
    PresetsFile,
    is_builtin,
    remove,
    upsert,
)
from app.store.settings import Settings, SettingsFile, pair_key

__all__ = [
    "BUILTIN_PRESETS",
    "Conversation",
    "Preset",
    "PresetsFile",
    "SearchHit",
    "Settings",
    "SettingsFile",
    "Store",
    "StoreChange",
    "StoredMessage",
    "default_data_dir",
    "is_builtin",
    "pair_key",
    "remove",
    "upsert",
    "write_atomic",
]
