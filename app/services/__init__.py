"""The thin Qt layer that owns the engine thread."""

from app.services.chat_controller import (
    ChatController,
    Reply,
    ReplyEnded,
    ReplyFailure,
    ReplyGrowth,
    ReplySaved,
)
from app.services.engine_service import (
    CalibrateRequest,
    CalibrationHandle,
    EngineFailure,
    EngineService,
    EngineWorker,
    GenerateRequest,
    GenerationResult,
    LoadProgress,
    LoadRequest,
    PairInfo,
    ReplyHandle,
    TokenBatch,
)
from app.services.hub_service import (
    HubFailure,
    HubProgress,
    HubResult,
    HubSearchResult,
    HubService,
)
from app.services.store_events import StoreEvents

__all__ = [
    "CalibrateRequest",
    "CalibrationHandle",
    "ChatController",
    "EngineFailure",
    "EngineService",
    "EngineWorker",
    "GenerateRequest",
    "GenerationResult",
    "HubFailure",
    "HubProgress",
    "HubResult",
    "HubSearchResult",
    "HubService",
    "LoadProgress",
    "LoadRequest",
    "PairInfo",
    "Reply",
    "ReplyEnded",
    "ReplyFailure",
    "ReplyGrowth",
    "ReplyHandle",
    "ReplySaved",
    "StoreEvents",
    "TokenBatch",
]
