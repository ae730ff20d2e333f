"""A server's prompt far past the window is refused as too long, cheaply, beside running replies."""

from __future__ import annotations

from typing import Any

import pytest
from pytestqt.qtbot import QtBot

from app.engine import GenerationParams, Message
from app.engine.generate import COUNT_CHUNK
from app.services import EngineFailure, EngineService, GenerationResult
from tests.conftest import TinyModels
from tests.fakes import _collect, _loaded


def test_a_megabytes_prompt_is_refused_too_long_without_tokenizing_it_whole(
    qtbot: QtBot, make_service, tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    encoded: list[int] = []  # the length of every text tokenized, on any thread
    original = TokenizersBackend._encode_plus

    def recording(self: Any, text: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(text, str):
            encoded.append(len(text))
        return original(self, text, *args, **kwargs)

    monkeypatch.setattr(TokenizersBackend, "_encode_plus", recording)
    service: EngineService = make_service()
    _loaded(qtbot, service, str(tiny.target))
    texts, ends = _collect(service)
    streaming = GenerationParams(max_tokens=150, temperature=0)
    first = service.generate([Message("user", "Tell me about cats.")], streaming, shared=True)
    qtbot.waitUntil(lambda: first.request_id in texts, timeout=30_000)
    huge = [Message("user", "The quick brown fox. " * 100_000)]  # 2 MB
    big = service.generate(huge, GenerationParams(max_tokens=16), shared=True)
    qtbot.waitUntil(lambda: big.request_id in ends, timeout=30_000)
    refused = ends[big.request_id]
    # Too long (the server's 400), not the memory being full (its 429).
    assert isinstance(refused, EngineFailure) and refused.too_long and not refused.full
    assert "window of 4,096" in refused.message
    assert max(encoded) <= COUNT_CHUNK  # sized a chunk at a time, never whole
    qtbot.waitUntil(lambda: first.request_id in ends, timeout=30_000)
    assert isinstance(ends[first.request_id], GenerationResult)  # it streamed on to its end
