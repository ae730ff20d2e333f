"""Persistence of conversations, free of Qt."""

from app.store.db import Conversation, Store, StoredMessage, default_data_dir
from app.store.settings import Settings, SettingsFile, pair_key, write_atomic

__all__ = [
    "Conversation",
    "Settings",
    "SettingsFile",
    "Store",
    "StoredMessage",
    "default_data_dir",
    "pair_key",
    "write_atomic",
]
