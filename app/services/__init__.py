"""The thin Qt layer that owns the engine thread."""

from app.engine.loader import LoadProgress
from app.services.chat_controller import (
    ChatController,
    Reply,
    ReplyEnded,
    ReplyFailure,
    ReplyGrowth,
    ReplyReading,
    ReplySaved,
    ReplyWaiting,
)
from app.services.engine_service import (
    CalibrateRequest,
    CalibrationHandle,
    EngineFailure,
    EngineLoad,
    EngineService,
    EngineWorker,
    GenerateRequest,
    GenerationResult,
    LoadRequest,
    PairInfo,
    PromptProgress,
    ReplyHandle,
    ReplyQueued,
    TokenBatch,
)
from app.services.hub_service import (
    HubFailure,
    HubProgress,
    HubResult,
    HubSearchResult,
    HubService,
)
from app.services.library_scan import LibraryScan, LibraryScanner
from app.services.store_events import StoreEvents

__all__ = [
    "CalibrateRequest",
    "CalibrationHandle",
    "ChatController",
    "EngineFailure",
    "EngineLoad",
    "EngineService",
    "EngineWorker",
    "GenerateRequest",
    "GenerationResult",
    "HubFailure",
    "HubProgress",
    "HubResult",
    "HubSearchResult",
    "HubService",
    "LibraryScan",
    "LibraryScanner",
    "LoadProgress",
    "LoadRequest",
    "PairInfo",
    "PromptProgress",
    "Reply",
    "ReplyEnded",
    "ReplyFailure",
    "ReplyGrowth",
    "ReplyHandle",
    "ReplyQueued",
    "ReplyReading",
    "ReplySaved",
    "ReplyWaiting",
    "StoreEvents",
    "TokenBatch",
]
