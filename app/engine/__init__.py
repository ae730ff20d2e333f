"""Tandem's inference engine: model loading and speculative decoding, free of Qt."""

from app.engine.loader import IncompatiblePairError, LoadedModel, ModelError, ModelPair, load_pair
from app.engine.types import Chunk, Finished, GenerationParams, Message, Origin, Stats

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
