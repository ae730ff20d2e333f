"""Tandem's inference engine: model loading and speculative decoding, free of Qt."""

from app.engine.loader import LoadedModel, ModelPair, load_pair
from app.engine.types import Chunk, Finished, GenerationParams, Message, Origin, Stats
from app.errors import IncompatiblePairError, ModelError

__all__ = [
    "Chunk",
    "Finished",
    "GenerationParams",
    "IncompatiblePairError",
    "LoadedModel",
    "Message",
    "ModelError",
    "ModelPair",
    "Origin",
    "Stats",
    "load_pair",
]
