"""The thin Qt layer that owns the engine thread."""

from app.services.engine_service import (
    EngineFailure,
    EngineService,
    EngineWorker,
    GenerateRequest,
    GenerationResult,
    LoadRequest,
    PairInfo,
    TokenBatch,
)

__all__ = [
    "EngineFailure",
    "EngineService",
    "EngineWorker",
    "GenerateRequest",
    "GenerationResult",
    "LoadRequest",
    "PairInfo",
    "TokenBatch",
]
