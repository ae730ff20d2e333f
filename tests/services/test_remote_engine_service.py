"""The engine worker with a remote engine: connect, stream, stop, fail in one line."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest
from pytestqt.qtbot import QtBot

from app.engine import Chunk, Finished, GenerationParams, Message, Origin, Stats
from app.engine.types import DraftSetting, FinishReason
from app.remote import RemoteEngine
from app.services import EngineFailure, EngineWorker, GenerationResult, PairInfo
from app.services.engine_service import LoadRequest
from tests.remote.conftest import mlx_url  # noqa: F401  (a real mlx_lm.server)
from tests.remote.servers import free_port

HELLO = [Message("user", "Hello")]


def _no_local_load(*_args, **_kwargs):
    raise AssertionError("a remote engine must not load local models")


def test_remote_engine_chats_through_the_service(
    qtbot: QtBot,
    make_service,
    mlx_url: str,  # noqa: F811
) -> None:
    service = make_service(EngineWorker(load=_no_local_load))
    # No model name: mlx_lm.server would load a named model from the Hub.
    target = RemoteEngine(mlx_url, "mlx-lm").to_target()
    with qtbot.waitSignal(service.pair_loaded, timeout=10_000) as loaded:
        service.load_pair(target, None)
    info: PairInfo = loaded.args[0]
    assert info.label == f"remote: mlx-lm @ {mlx_url.removeprefix('http://')}"
    assert info.target == target and info.draft is None

    batches: list = []
    service.tokens_generated.connect(batches.append)
    with qtbot.waitSignal(service.generation_finished, timeout=20_000) as blocker:
        service.generate(HELLO, GenerationParams(max_tokens=8, drafting=DraftSetting.of(0)))
    result: GenerationResult = blocker.args[0]
    assert "".join(b.text for b in batches)
    assert result.finished.finish_reason == "length"
    assert result.finished.stats.tokens == 8
    assert result.finished.stats.stats_scope == "not reported"
    # Stats survive the round trip the message store makes.
    assert Stats.from_dict(result.finished.stats.as_dict()) == result.finished.stats
    assert not service.busy


def test_dead_server_fails_to_load_in_one_line(qtbot: QtBot, make_service) -> None:
    service = make_service(EngineWorker(load=_no_local_load))
    with qtbot.waitSignal(service.failed, timeout=10_000) as blocker:
        service.load_pair(f"http://127.0.0.1:{free_port()}#kind=vllm", None)
    failure: EngineFailure = blocker.args[0]
    assert failure.stage == "load"
    assert "connection refused" in failure.message and "\n" not in failure.message


def _scripted_remote(chunks: int, delay: float = 0.01):
    def stream(
        engine: RemoteEngine,
        _messages: Sequence[Message],
        _params: GenerationParams,
        cancel: threading.Event,
    ) -> Iterator[Chunk | Finished]:
        sent = 0
        for _ in range(chunks):
            if cancel.wait(delay):
                break
            sent += 1
            yield Chunk("x", (-1,), (Origin.TARGET,), ("x",))
        reason: FinishReason = "cancelled" if cancel.is_set() else "stop"
        yield Finished(Stats(tokens=sent, stats_scope="not reported"), reason)

    return stream


def test_stop_reaches_the_remote_stream(qtbot: QtBot, make_service) -> None:
    checked: list[RemoteEngine] = []
    worker = EngineWorker(
        load=_no_local_load, check_remote=checked.append, stream_remote=_scripted_remote(10_000)
    )
    service = make_service(worker)
    engine = RemoteEngine("http://node:8000", "ollama", "llama3")
    with qtbot.waitSignal(service.pair_loaded, timeout=5_000):
        service.load_remote(engine)
    assert checked == [engine]
    with qtbot.waitSignal(service.tokens_generated, timeout=5_000):
        reply = service.generate(HELLO, GenerationParams())
    with qtbot.waitSignal(service.generation_finished, timeout=5_000) as blocker:
        reply.cancel()
    result: GenerationResult = blocker.args[0]
    assert result.finished.finish_reason == "cancelled"
    assert 0 < result.finished.stats.tokens < 10_000


def test_calibration_is_refused_for_a_remote_engine(qtbot: QtBot, make_service) -> None:
    worker = EngineWorker(load=_no_local_load, check_remote=lambda _e: None)
    service = make_service(worker)
    with qtbot.waitSignal(service.pair_loaded, timeout=5_000):
        service.load_pair("https://node:8000/v1#kind=vllm", None)
    with qtbot.waitSignal(service.failed, timeout=5_000) as blocker:
        service.calibrate(["hi"], [2])
    assert "needs a local pair" in blocker.args[0].message


def test_load_request_reads_remote_targets() -> None:
    assert LoadRequest("/models/qwen").remote_engine() is None
    engine = LoadRequest("http://h:1/v1/#kind=lmstudio&model=m").remote_engine()
    assert engine == RemoteEngine("http://h:1", "lmstudio", "m")
    with pytest.raises(ValueError):
        LoadRequest("http://h:1#kind=nope").remote_engine()
