"""The thin Qt layer that owns the engine thread."""

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

__all__ = [
    "CalibrateRequest",
    "CalibrationHandle",
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
    "ReplyHandle",
    "TokenBatch",
]
