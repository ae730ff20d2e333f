from __future__ import annotations

import gc
import threading
import time

import pytest
from pytestqt.qtbot import QtBot

from app.engine import (
    Finished,
    GenerationParams,
    Message,
    ModelPair,
    Stats,
)
from app.engine.types import DraftSetting
from app.services import (
    CalibrationHandle,
    EngineFailure,
    EngineService,
    EngineWorker,
    GenerationResult,
    PairInfo,
    TokenBatch,
)
from tests.conftest import TinyModels
from tests.fakes import Pause, _Engine, _fake_load, _loaded, _reads_then_replies, _scripted

HELLO = [Message("user", "Hello")]


def test_real_pair_streams_started_tokens_finished_in_order(
    qtbot: QtBot, make_service, tiny: TinyModels
) -> None:
    service = make_service()
    info = _loaded(qtbot, service, str(tiny.target), str(tiny.copy))
    assert isinstance(info, PairInfo)
    assert info.label == "tiny-llama + tiny-copy"
    order: list[str] = []
    batches: list[TokenBatch] = []
    service.generation_started.connect(lambda _rid: order.append("started"))
    service.tokens_generated.connect(lambda b: (order.append("tokens"), batches.append(b)))  # type: ignore[func-returns-value]
    service.generation_finished.connect(lambda _r: order.append("finished"))
    with qtbot.waitSignals(
        [service.generation_started, service.tokens_generated, service.generation_finished],
        order="simple",
        timeout=20_000,
    ):
        rid = service.generate(
            HELLO, GenerationParams(max_tokens=30, drafting=DraftSetting.of(3))
        ).request_id
    qtbot.waitUntil(lambda: "finished" in order)
    assert order[0] == "started" and order[-1] == "finished"
    assert set(order[1:-1]) == {"tokens"}
    assert all(b.request_id == rid for b in batches)
    assert not service.busy


def test_batches_carry_the_text_and_the_result_its_stats_and_pair(
    qtbot: QtBot, make_service, tiny: TinyModels
) -> None:
    service = make_service()
    _loaded(qtbot, service, str(tiny.target), str(tiny.copy))
    batches: list[TokenBatch] = []
    service.tokens_generated.connect(batches.append)
    with qtbot.waitSignal(service.generation_finished, timeout=20_000) as blocker:
        service.generate(HELLO, GenerationParams(max_tokens=20, drafting=DraftSetting.of(4)))
    result: GenerationResult = blocker.args[0]
    # The text comes once, in the batches, token for token what the reply ended with.
    assert "".join(b.text for b in batches)
    assert tuple(t for b in batches for t in b.token_ids) == result.finished.token_ids
    assert result.finished.stats.acceptance == 1.0
    assert result.pair.draft == str(tiny.copy)


def test_stop_cancels_within_a_round(qtbot: QtBot, make_service) -> None:
    service = make_service(EngineWorker(load=_fake_load, stream=_scripted(10_000, delay=0.002)))
    _loaded(qtbot, service)
    with qtbot.waitSignal(service.tokens_generated, timeout=5_000):
        reply = service.generate(HELLO, GenerationParams())
    with qtbot.waitSignal(service.generation_finished, timeout=5_000) as blocker:
        reply.cancel()
    result: GenerationResult = blocker.args[0]
    assert result.finished.finish_reason == "cancelled"
    assert 0 < len(result.finished.token_ids) < 10_000
    assert not service.busy


def test_updates_are_throttled_and_lose_nothing(qtbot: QtBot, make_service) -> None:
    worker = EngineWorker(load=_fake_load, stream=_scripted(300, delay=0.001))
    service = make_service(worker)
    _loaded(qtbot, service)
    batches: list[TokenBatch] = []
    service.tokens_generated.connect(batches.append)
    with qtbot.waitSignal(service.generation_finished, timeout=10_000) as blocker:
        service.generate(HELLO, GenerationParams())
    # 300 chunks over at least 0.3 s arrive in a handful of ~30 Hz batches.
    assert 1 <= len(batches) < 100
    assert "".join(b.text for b in batches) == "".join(f"t{i} " for i in range(300))
    assert sum(len(b.token_ids) for b in batches) == len(blocker.args[0].finished.token_ids)


def test_engine_error_arrives_as_a_value(qtbot: QtBot, make_service) -> None:
    service = make_service(EngineWorker(load=_fake_load, stream=_scripted(10, fail_at=3)))
    _loaded(qtbot, service)
    batches: list[TokenBatch] = []
    service.tokens_generated.connect(batches.append)
    with qtbot.waitSignal(service.failed, timeout=5_000) as blocker:
        rid = service.generate(HELLO, GenerationParams()).request_id
    failure: EngineFailure = blocker.args[0]
    assert failure.request_id == rid
    assert failure.stage == "generate"
    assert "out of memory" in failure.message
    # What streamed before the error reached its caller before the failure did.
    assert "".join(b.text for b in batches) == "t0 t1 t2 "
    assert not service.busy
    # The thread is still alive and serves the next request.
    with qtbot.waitSignal(service.failed, timeout=5_000):
        service.generate(HELLO, GenerationParams())


def test_bad_folder_fails_to_load(qtbot: QtBot, make_service, tmp_path) -> None:
    service = make_service()
    with qtbot.waitSignal(service.failed, timeout=5_000) as blocker:
        service.load_pair(str(tmp_path / "missing"))
    failure: EngineFailure = blocker.args[0]
    assert failure.stage == "load"
    assert "no such folder" in failure.message


def test_generating_without_a_pair_fails(qtbot: QtBot, make_service) -> None:
    service = make_service()
    with qtbot.waitSignal(service.failed, timeout=5_000) as blocker:
        service.generate(HELLO, GenerationParams())
    assert blocker.args[0].message == "No model is loaded."


def test_loading_a_real_pair_reports_each_step(
    qtbot: QtBot, make_service, tiny: TinyModels
) -> None:
    service = make_service()
    steps: list[tuple[int, int, str]] = []
    service.load_progressed.connect(lambda p: steps.append((p.step, p.steps, p.text)))
    _loaded(qtbot, service, str(tiny.target), str(tiny.draft))
    assert list(dict.fromkeys(steps)) == [  # a model's step repeats as its bytes are read
        (0, 1, "Checking memory"),
        (0, 3, "Checking the pair"),  # before any weight is read
        (1, 3, "Loading tiny-llama"),
        (2, 3, "Loading tiny-qwen2"),
    ]


def test_work_runs_on_the_engine_thread(qtbot: QtBot, make_service) -> None:
    seen: list[str] = []

    def load(_t: str, _d: str | None, progress=None, loaded=None) -> ModelPair:
        seen.append(threading.current_thread().name)
        return _fake_load(_t, _d)

    service = make_service(EngineWorker(load=load))
    _loaded(qtbot, service)
    assert seen and seen[0] != threading.main_thread().name


def test_shutdown_joins_the_thread(qtbot: QtBot) -> None:
    service = EngineService(EngineWorker(load=_fake_load, stream=_scripted(10_000, delay=0.002)))
    _loaded(qtbot, service)
    service.generate(HELLO, GenerationParams())
    assert service.shutdown(timeout_ms=5_000)
    assert service.shutdown()  # a second call is harmless


def test_a_pair_that_does_not_fit_is_refused_before_loading(
    qtbot: QtBot, make_service, tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.hub import fit

    loads: list[str] = []

    def load(target: str, draft: str | None, progress=None, loaded=None) -> ModelPair:
        loads.append(target)
        return _fake_load(target, draft)

    monkeypatch.setattr(fit, "usable_memory_bytes", lambda total=None, **_: 1_000)
    service = make_service(EngineWorker(load=load))
    with qtbot.waitSignal(service.failed, timeout=5_000) as blocker:
        service.load_pair(str(tiny.target), str(tiny.draft))
    failure: EngineFailure = blocker.args[0]
    assert failure.stage == "load"
    assert failure.message.startswith("This pair does not fit: needs ")
    assert "usable" in failure.message
    assert loads == []


def test_batches_and_result_carry_text_by_origin_and_rounds(
    qtbot: QtBot, make_service, tiny: TinyModels
) -> None:
    service = make_service()
    _loaded(qtbot, service, str(tiny.target), str(tiny.noisy))
    batches: list[TokenBatch] = []
    service.tokens_generated.connect(batches.append)
    with qtbot.waitSignal(service.generation_finished, timeout=20_000) as blocker:
        service.generate(HELLO, GenerationParams(max_tokens=40, drafting=DraftSetting.of(3)))
    result: GenerationResult = blocker.args[0]
    for b in batches:
        assert "".join(text for _, text in b.segments) == b.text
        # Adjacent runs of a batch differ in origin.
        assert all(x[0] != y[0] for x, y in zip(b.segments[:-1], b.segments[1:], strict=True))
    rounds = [r for b in batches for r in b.rounds]
    assert sum(r.tokens for r in rounds) == result.finished.stats.tokens
    assert sum(r.accepted for r in rounds) == result.finished.stats.accepted


def test_draft_length_changes_for_the_reply_in_flight(qtbot: QtBot, make_service) -> None:
    seen: list[int | None] = []
    running = threading.Event()

    def stream(_pair, _messages, params, cancel, control=None, decoder=None):  # type: ignore[no-untyped-def]
        seen.append(control.setting.num_draft)
        running.set()
        while control.setting.num_draft != 7 and not cancel.is_set():
            time.sleep(0.001)
        seen.append(control.setting.num_draft)
        yield Finished(Stats(), "stop", (), ())

    service = make_service(EngineWorker(load=_fake_load, stream=stream))
    _loaded(qtbot, service)
    with qtbot.waitSignal(service.generation_finished, timeout=5_000):
        reply = service.generate(HELLO, GenerationParams(drafting=DraftSetting.of(2)))
        # generation_started comes before the stream runs: wait for the stream itself.
        qtbot.waitUntil(running.is_set)
        reply.set_drafting(DraftSetting.fixed(7))
    assert seen == [2, 7]


def test_calibration_runs_on_the_engine_thread_and_reports(
    qtbot: QtBot, make_service, tiny: TinyModels
) -> None:
    from app.engine.calibrate import CalibrationResult

    service = make_service()
    _loaded(qtbot, service, str(tiny.target), str(tiny.copy))
    progress: list[str] = []
    service.calibration_progressed.connect(lambda p: progress.append(p.text))
    with qtbot.waitSignal(service.calibration_finished, timeout=60_000) as blocker:
        service.calibrate(["Say hi.", "Count to three."], (0, 2, None), max_tokens=8)
        assert service.busy
    result: CalibrationResult = blocker.args[0]
    assert [p.k for p in result.points] == [0, 2, None]
    assert result.best_k in (0, 2)
    # The costs of widths 1 … k_max + 1 and the draft step, a warm-up, each k on each prompt.
    assert len(progress) == (2 + 1 + 1) + 1 + 3 * 2
    assert progress[0].startswith("measuring costs")
    assert not service.busy


def test_a_cancelled_calibration_finishes_without_a_result(
    qtbot: QtBot, make_service, tiny: TinyModels
) -> None:
    service = make_service()
    _loaded(qtbot, service, str(tiny.target), str(tiny.copy))
    handles: list[CalibrationHandle] = []
    service.calibration_progressed.connect(lambda _p: handles[0].cancel())
    with qtbot.waitSignal(service.calibration_finished, timeout=60_000) as blocker:
        handles.append(service.calibrate(["Say hi."], (0, 1, 2), max_tokens=8))
    assert blocker.args[0] is None and not service.busy


def test_calibration_without_a_pair_fails_as_a_value(qtbot: QtBot, make_service) -> None:
    service = make_service()
    with qtbot.waitSignal(service.failed, timeout=5_000) as blocker:
        service.calibrate(["x"], (0, 1))
    assert blocker.args[0].stage == "calibrate" and not service.busy


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (MemoryError(), "out of memory"),
        (
            RuntimeError("[metal::malloc] Attempting to allocate 9000000000 bytes"),
            "[metal::malloc] Attempting to allocate 9000000000 bytes",
        ),
        (
            RuntimeError("[METAL] Command buffer execution failed: Insufficient Memory\nmore"),
            "[METAL] Command buffer execution failed: Insufficient Memory",
        ),
        (RuntimeError("Out of memory while decoding"), "Out of memory while decoding"),
    ],
)
def test_out_of_memory_unloads_the_pair_and_loading_again_works(
    qtbot: QtBot, make_service, monkeypatch: pytest.MonkeyPatch, error: Exception, reason: str
) -> None:
    import app.services.engine_service as engine_service

    engine = _Engine(error)
    freed: list[int] = []
    monkeypatch.setattr(engine_service, "free_memory", lambda: freed.append(1))
    service = make_service(EngineWorker(load=engine.load, stream=engine.stream))
    _loaded(qtbot, service)
    freed.clear()
    with qtbot.waitSignal(service.failed, timeout=5_000) as blocker:
        rid = service.generate(HELLO, GenerationParams()).request_id
    failure: EngineFailure = blocker.args[0]
    assert failure == EngineFailure(
        rid,
        "generate",
        f"Generation failed: {reason}; the models were unloaded to free memory. "
        "Load them again, or choose a smaller pair.",
        unloaded=True,
    )
    assert freed and not service.busy
    # Nothing holds the weights any more: not the worker, not the traceback's frames.
    gc.collect()
    assert engine.weights[0]() is None
    with qtbot.waitSignal(service.failed, timeout=5_000) as blocker:
        service.generate(HELLO, GenerationParams())
    assert blocker.args[0].message == "No model is loaded."
    # Loading again works, and so does the next reply.
    _loaded(qtbot, service)
    batches: list[TokenBatch] = []
    service.tokens_generated.connect(batches.append)
    with qtbot.waitSignal(service.generation_finished, timeout=5_000):
        service.generate(HELLO, GenerationParams())
    assert "".join(b.text for b in batches) == "t0 t1 "


def test_other_errors_keep_the_pair(qtbot: QtBot, make_service) -> None:
    engine = _Engine(RuntimeError("shapes (3,) and (4,) do not match"))
    service = make_service(EngineWorker(load=engine.load, stream=engine.stream))
    _loaded(qtbot, service)
    with qtbot.waitSignal(service.failed, timeout=5_000) as blocker:
        service.generate(HELLO, GenerationParams())
    assert blocker.args[0].message == "Generation failed: shapes (3,) and (4,) do not match"
    assert not blocker.args[0].unloaded
    with qtbot.waitSignal(service.generation_finished, timeout=5_000):
        service.generate(HELLO, GenerationParams())
    assert len(engine.weights) == 1  # no second load was needed


def test_running_out_of_memory_while_loading_unloads_the_old_pair(
    qtbot: QtBot, make_service
) -> None:
    engine = _Engine(RuntimeError("unused"))
    calls = 0

    def load(target: str, draft: str | None, progress=None, loaded=None) -> ModelPair:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise MemoryError()
        return engine.load(target, draft)

    service = make_service(EngineWorker(load=load, stream=engine.stream))
    _loaded(qtbot, service, "old")
    with qtbot.waitSignal(service.failed, timeout=5_000) as blocker:
        service.load_pair("huge")
    failure: EngineFailure = blocker.args[0]
    assert failure.stage == "load" and failure.unloaded
    assert failure.message == (
        "Loading failed: out of memory; the models were unloaded to free memory. "
        "Choose a smaller pair, or quit other apps."
    )
    gc.collect()
    assert engine.weights[0]() is None


def test_running_out_of_memory_while_tuning_unloads_the_pair(
    qtbot: QtBot, make_service, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.engine.calibrate as calibrate

    def fail(*_args, **_kwargs):
        raise MemoryError()
        yield  # a generator, as the real one

    monkeypatch.setattr(calibrate, "calibrate", fail)
    engine = _Engine(RuntimeError("unused"))
    service = make_service(EngineWorker(load=engine.load, stream=engine.stream))
    _loaded(qtbot, service)
    with qtbot.waitSignal(service.failed, timeout=5_000) as blocker:
        service.calibrate(["x"], (0, 1))
    assert blocker.args[0].stage == "calibrate" and blocker.args[0].unloaded
    assert "the models were unloaded" in blocker.args[0].message
    assert not service.busy


def test_a_loaded_pair_keeps_its_cost_profile_in_the_given_data_folder(
    qtbot: QtBot, make_service, tiny: TinyModels, tmp_path
) -> None:
    from app.engine.costs import CostProfile, ProfileStore
    from app.engine.generate import stream_reply

    store = ProfileStore(tmp_path / "profiles.json")
    stored = CostProfile((0.01, 0.012, 0.013), 0.002, 64, "test", "0")
    store.put(str(tiny.target), str(tiny.noisy), stored)
    seen: list[CostProfile] = []

    def stream(pair, messages, params, cancel, control=None, decoder=None, **given):  # type: ignore[no-untyped-def]
        seen.append(decoder.costs.profile())
        yield from stream_reply(
            pair, messages, params, cancel, control=control, decoder=decoder, **given
        )

    service = make_service(EngineWorker(stream=stream, profiles=store))
    _loaded(qtbot, service, str(tiny.target), str(tiny.noisy))
    with qtbot.waitSignal(service.generation_finished, timeout=60_000):
        service.generate(HELLO, GenerationParams(max_tokens=4))
    # The decoder started from the profile stored there, not from the default folder's.
    assert seen and seen[0].verify[:3] == stored.verify


def _results(service: EngineService) -> dict[int, GenerationResult]:
    results: dict[int, GenerationResult] = {}
    service.generation_finished.connect(lambda r: results.__setitem__(r.request_id, r))
    return results


def test_a_waiting_reply_withdrawn_leaves_the_running_one_whole(qtbot: QtBot, make_service) -> None:
    pause = Pause()
    stream = _scripted(200, delay=0.002, pause=pause)
    service = make_service(EngineWorker(load=_fake_load, stream=stream))
    _loaded(qtbot, service)
    results = _results(service)
    started: list[int] = []
    service.generation_started.connect(started.append)
    with qtbot.waitSignal(service.tokens_generated, timeout=5_000):
        running = service.generate(HELLO, GenerationParams())
    # The engine takes the next reply in only after it is withdrawn, however slow this machine.
    pause.hold()
    waiting = service.generate(HELLO, GenerationParams())
    waiting.cancel()
    pause.release()
    # The withdrawn one ends as soon as the engine takes it in, between rounds.
    qtbot.waitUntil(lambda: waiting.request_id in results, timeout=10_000)
    assert running.request_id not in results
    qtbot.waitUntil(lambda: running.request_id in results, timeout=10_000)
    whole = results[running.request_id].finished
    assert (whole.finish_reason, len(whole.token_ids)) == ("length", 200)
    withdrawn = results[waiting.request_id]
    assert withdrawn.finished.finish_reason == "cancelled"
    assert not withdrawn.finished.token_ids
    assert started == [running.request_id]  # the withdrawn one never ran
    assert not service.busy


def test_stopping_the_running_reply_leaves_the_waiting_one(qtbot: QtBot, make_service) -> None:
    service = make_service(EngineWorker(load=_fake_load, stream=_scripted(200, delay=0.002)))
    _loaded(qtbot, service)
    results = _results(service)
    with qtbot.waitSignal(service.tokens_generated, timeout=5_000):
        running = service.generate(HELLO, GenerationParams())
    waiting = service.generate(HELLO, GenerationParams())
    running.cancel()
    qtbot.waitUntil(lambda: waiting.request_id in results, timeout=10_000)
    assert results[running.request_id].finished.finish_reason == "cancelled"
    assert results[waiting.request_id].finished.finish_reason == "length"
    assert len(results[waiting.request_id].finished.token_ids) == 200
    assert running.cancelled and not waiting.cancelled


def test_each_reply_has_its_own_draft_length(qtbot: QtBot, make_service) -> None:
    seen: dict[int, list[int | None]] = {}
    release = threading.Event()

    def stream(_pair, _messages, params, cancel, control=None, decoder=None):  # type: ignore[no-untyped-def]
        seen.setdefault(params.seed, []).append(control.setting.num_draft)
        release.wait(5)
        seen[params.seed].append(control.setting.num_draft)
        yield Finished(Stats(), "stop", (), ())

    service = make_service(EngineWorker(load=_fake_load, stream=stream))
    _loaded(qtbot, service)
    results = _results(service)
    first = service.generate(HELLO, GenerationParams(drafting=DraftSetting.of(2), seed=1))
    second = service.generate(HELLO, GenerationParams(drafting=DraftSetting.of(3), seed=2))
    qtbot.waitUntil(lambda: 1 in seen)
    second.set_drafting(DraftSetting.fixed(9))  # the waiting reply's, not the running one's
    release.set()
    qtbot.waitUntil(lambda: second.request_id in results, timeout=5_000)
    assert seen == {1: [2, 2], 2: [9, 9]}
    assert first.request_id in results


def test_a_waiting_calibration_withdrawn_never_runs(qtbot: QtBot, make_service) -> None:
    service = make_service(EngineWorker(load=_fake_load, stream=_scripted(100, delay=0.002)))
    _loaded(qtbot, service)
    progressed: list[object] = []
    service.calibration_progressed.connect(progressed.append)
    failures: list[EngineFailure] = []
    service.failed.connect(failures.append)
    results = _results(service)
    with qtbot.waitSignal(service.tokens_generated, timeout=5_000):
        reply = service.generate(HELLO, GenerationParams())
    with qtbot.waitSignal(service.calibration_finished, timeout=10_000) as blocker:
        service.calibrate(["x"], (0, 1)).cancel()
    # Cancelled, it finishes without a result; the fake pair could not have calibrated.
    assert blocker.args[0] is None and not progressed and not failures
    assert results[reply.request_id].finished.finish_reason == "length"
    assert not service.busy


def test_failures_name_the_reply_they_belong_to(qtbot: QtBot, make_service) -> None:
    service = make_service(EngineWorker(load=_fake_load, stream=_scripted(3, fail_at=1)))
    _loaded(qtbot, service)
    failures: list[EngineFailure] = []
    service.failed.connect(failures.append)
    first = service.generate(HELLO, GenerationParams())
    second = service.generate(HELLO, GenerationParams())
    qtbot.waitUntil(lambda: len(failures) == 2, timeout=10_000)
    assert [(f.stage, f.request_id) for f in failures] == [
        ("generate", first.request_id),
        ("generate", second.request_id),
    ]


def _weight_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The folders whose weights mlx-lm reads from now on, on any thread."""
    import mlx_lm.utils

    reads: list[str] = []
    real = mlx_lm.utils.load

    def spy(path, *args, **kw):  # type: ignore[no-untyped-def]
        reads.append(str(path))
        return real(path, *args, **kw)

    monkeypatch.setattr(mlx_lm.utils, "load", spy)
    return reads


def _answers(qtbot: QtBot, service: EngineService) -> GenerationResult:
    with qtbot.waitSignal(service.generation_finished, timeout=60_000) as blocker:
        service.generate(HELLO, GenerationParams(max_tokens=6, drafting=DraftSetting.of(3)))
    return blocker.args[0]


def test_a_bad_draft_is_refused_before_any_weight_is_read_and_the_pair_still_answers(
    qtbot: QtBot, make_service, tiny: TinyModels, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = make_service()
    _loaded(qtbot, service, str(tiny.target), str(tiny.copy))
    reads = _weight_reads(monkeypatch)
    steps: list[str] = []
    service.load_progressed.connect(lambda p: steps.append(p.text))
    not_a_model = tmp_path / "downloads"
    not_a_model.mkdir()
    with qtbot.waitSignal(service.failed, timeout=20_000) as blocker:
        # A target not loaded yet: without the check up front it would be read first.
        service.load_pair(str(tiny.noisy), str(not_a_model))
    failure: EngineFailure = blocker.args[0]
    assert failure.stage == "load" and not failure.unloaded
    assert failure.message == "downloads: no config.json, so this is not a model folder"
    assert reads == []  # refused before any weight was read
    assert not any(text.startswith("Loading") for text in steps)
    result = _answers(qtbot, service)  # the loaded pair still answers
    assert result.pair.target == str(tiny.target) and result.pair.draft == str(tiny.copy)
    assert result.finished.stats.tokens > 0


def test_changing_only_the_draft_keeps_the_loaded_target(
    qtbot: QtBot, make_service, tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = make_service()
    _loaded(qtbot, service, str(tiny.target), str(tiny.copy))
    reads = _weight_reads(monkeypatch)
    steps: list[str] = []
    service.load_progressed.connect(lambda p: steps.append(p.text))
    info = _loaded(qtbot, service, str(tiny.target), str(tiny.noisy))
    assert info.label == "tiny-llama + tiny-noisy"
    assert reads == [str(tiny.noisy.resolve())]  # the target's weights were not read again
    assert "Keeping tiny-llama, loaded already" in steps
    assert _answers(qtbot, service).pair.draft == str(tiny.noisy)


def test_a_pair_that_fits_only_without_the_loaded_one_is_refused_and_that_one_stays(
    qtbot: QtBot, make_service, tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.hub import fit

    service = make_service()
    _loaded(qtbot, service, str(tiny.target), str(tiny.copy))
    # A machine with room for the new pair alone: the loaded one stays until it is in.
    room = fit.memory_fit(tiny.noisy, tiny.draft, available=10**12).needed_bytes
    monkeypatch.setattr(fit, "usable_memory_bytes", lambda *, held=0, **_: room - held)
    reads = _weight_reads(monkeypatch)
    with qtbot.waitSignal(service.failed, timeout=20_000) as blocker:
        service.load_pair(str(tiny.noisy), str(tiny.draft))
    message = blocker.args[0].message
    assert message.startswith("This pair does not fit: needs ")
    assert "while the loaded" in message and "stays in memory" in message
    assert "\n" not in message and reads == []
    assert _answers(qtbot, service).pair.draft == str(tiny.copy)


@pytest.mark.parametrize(("interval", "passed_on"), [(0.0, 3), (60.0, 1)])
def test_reading_the_prompt_is_passed_on_throttled_before_the_tokens(
    qtbot: QtBot, make_service, interval: float, passed_on: int
) -> None:
    from app.engine.types import Reading
    from app.services import PromptProgress

    worker = EngineWorker(load=_fake_load, stream=_reads_then_replies(3), flush_interval=interval)
    service = make_service(worker)
    _loaded(qtbot, service)
    order: list[object] = []
    service.prompt_progressed.connect(order.append)
    service.tokens_generated.connect(lambda _b: order.append("tokens"))
    with qtbot.waitSignal(service.generation_finished, timeout=5_000):
        rid = service.generate(HELLO, GenerationParams()).request_id
    readings = order[:-1]
    assert order[-1] == "tokens" and len(readings) == passed_on
    # The first comes at once: it says how long the prompt is.
    assert readings[0] == PromptProgress(rid, Reading(0, 1_204, 0))


def test_the_windows_prompt_is_made_off_the_engine_thread_and_read_once(
    qtbot: QtBot, make_service, tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.fakes import _prompt_threads

    made_on, engine_threads, stream = _prompt_threads(monkeypatch)
    service = make_service(EngineWorker(stream=stream))
    _loaded(qtbot, service, str(tiny.target), str(tiny.copy))
    with qtbot.waitSignal(service.generation_finished, timeout=30_000) as blocker:
        service.generate([Message("user", "Hello there")], GenerationParams(max_tokens=8))
    assert blocker.args[0].finished.stats.tokens == 8
    # Made once, on neither the engine's thread (others' rounds would wait) nor the GUI's.
    assert len(made_on) == 1 and engine_threads
    assert not set(made_on) & (engine_threads | {threading.main_thread().ident})
    # One too long is refused as such, from what was found there, not read again.
    with qtbot.waitSignal(service.failed, timeout=30_000) as failed:
        service.generate([Message("user", "word " * 100_000)], GenerationParams(max_tokens=8))
    assert failed.args[0].too_long and "window" in failed.args[0].message
    assert len(made_on) == 2 and not set(made_on) & engine_threads


def test_the_windows_reply_on_a_sliding_window_model_is_plain_greedy_past_the_window(
    qtbot: QtBot, make_service, tiny: TinyModels, tmp_path
) -> None:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    from app.engine import load_pair
    from app.engine.generate import encode_chat
    from tests.engine.families import WINDOW, window_pair

    target, copy = window_pair(tmp_path, "gemma3_text", tiny.target)
    service = make_service()
    _loaded(qtbot, service, str(target), str(copy))
    long = [Message("user", "Summarise the following text in one sentence. " * 3)]
    replies = []
    for messages in (long, [*long, Message("assistant", "Yes."), Message("user", "Why?")]):
        with qtbot.waitSignal(service.generation_finished, timeout=60_000) as blocker:
            service.generate(messages, GenerationParams(temperature=0, max_tokens=48))
        replies.append((messages, blocker.args[0].finished))
    # The reference: mlx-lm's own greedy decoding, on this thread's own load of the target.
    reference = load_pair(target)
    for messages, finished in replies:
        prompt = encode_chat(reference.target.tokenizer, messages)
        want = [
            int(t)
            for t, _ in generate_step(mx.array(prompt), reference.target.model, max_tokens=48)
        ]
        assert len(prompt) + len(finished.token_ids) > 2 * WINDOW
        assert list(finished.token_ids) == want[: len(finished.token_ids)]
        assert finished.stats.drafted > 0 and finished.stats.accepted == finished.stats.drafted


def test_a_target_loads_with_its_own_mtp_head_and_memory_counts_it(
    qtbot: QtBot, make_service, tiny: TinyModels, tmp_path
) -> None:
    from tests.engine.families import mtp_model

    target = str(mtp_model(tmp_path / "qwen3.5-tiny", tiny.target))
    service = make_service()
    steps: list[str] = []
    service.load_progressed.connect(lambda p: steps.append(p.text))
    info = _loaded(qtbot, service, target, "mtp")
    assert info.label == "qwen3.5-tiny + mtp" and info.draft == "mtp"
    assert "Loading qwen3.5-tiny's MTP head" in steps
    # Its memory is sized with the head, not skipped as that of an unknown folder.
    from app.services.engine_service import LoadRequest, _memory_fit

    fit = _memory_fit(LoadRequest(target, "mtp"), None)
    alone = _memory_fit(LoadRequest(target, None), None)
    assert fit is not None and alone is not None and fit.kv_bytes > alone.kv_bytes
