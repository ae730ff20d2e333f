"""Remote engines: OpenAI-compatible servers that generate for Tandem. No Qt here."""

from app.remote.client import (
    REMOTE_TOKEN,
    RemoteEngine,
    check_remote,
    is_remote_target,
    stream_remote,
    target_name,
    target_text,
    target_tooltip,
)
from app.remote.stats import SERVER_KINDS, ServerKind, SpecReport, StatsScope

__all__ = [
    "REMOTE_TOKEN",
    "SERVER_KINDS",
    "RemoteEngine",
    "ServerKind",
    "SpecReport",
    "StatsScope",
    "check_remote",
    "is_remote_target",
    "stream_remote",
    "target_name",
    "target_text",
    "target_tooltip",
]
