"""Replies side by side on the engine thread: the shared batch, its lanes and its memory."""

from __future__ import annotations

import pytest
from pytestqt.qtbot import QtBot

from app.engine import GenerationParams, Message, load_pair
from app.engine.batch_costs import BatchProfile
from app.engine.costs import ProfileStore
from app.engine.decoder import Decoder
from app.engine.generate import encode_chat
from app.engine.side_by_side import ROOM
from app.engine.stacked import SLACK
from app.engine.types import DraftSetting
from app.hub.fit import kv_cache_bytes
from app.services import EngineFailure, EngineService, GenerationResult
from app.services import engine_service as es
from tests.conftest import TinyModels
from tests.fakes import _collect, _loaded

LONG = GenerationParams(max_tokens=150, drafting=DraftSetting.of(3), temperature=0)


def _prompt(topic: str) -> list[Message]:
    return [Message("user", f"Tell me about {topic}.")]


def _second_while_first_runs(
    qtbot: QtBot, service: EngineService
) -> tuple[int, int, dict[int, object]]:
    """Two server replies, the second asked for once the first streams; both waited for."""
    texts, ends = _collect(service)
    first = service.generate(_prompt("cats"), LONG, shared=True).request_id
    qtbot.waitUntil(lambda: first in texts, timeout=30_000)
    second = service.generate(_prompt("dogs"), LONG, shared=True).request_id
    qtbot.waitUntil(lambda: first in ends and second in ends, timeout=30_000)
    return first, second, ends


def test_server_replies_and_the_window_reply_run_side_by_side(
    qtbot: QtBot, make_service, tiny: TinyModels
) -> None:
    service = make_service()
    _loaded(qtbot, service, str(tiny.target), str(tiny.noisy))
    texts, ends = _collect(service)
    alone = {}
    for topic in ("cats", "dogs", "rain"):
        rid = service.generate(_prompt(topic), LONG).request_id
        qtbot.waitUntil(lambda: rid in ends, timeout=30_000)  # noqa: B023 (waited for here)
        alone[topic] = texts[rid]
    loads: list[es.EngineLoad] = []
    service.load_changed.connect(loads.append)
    ids = {
        "cats": service.generate(_prompt("cats"), LONG, shared=True).request_id,
        "dogs": service.generate(_prompt("dogs"), LONG, shared=True).request_id,
        "rain": service.generate(_prompt("rain"), LONG).request_id,  # the window's
    }
    qtbot.waitUntil(lambda: all(i in ends for i in ids.values()), timeout=30_000)
    assert {t: texts[i] for t, i in ids.items()} == alone
    assert all(isinstance(ends[i], GenerationResult) for i in ids.values())
    # The engine reports its load after the last reply ends: that report may still be queued.
    qtbot.waitUntil(lambda: bool(loads) and loads[-1].active == 0, timeout=5_000)
    # The window's reply joined the batch rather than waiting for it.
    assert loads[-1].batch.largest == 3 and service.load.batch.largest == 3


def test_the_batch_stores_what_its_rounds_measured_beside_the_pair_profile(
    qtbot: QtBot, make_service, tiny: TinyModels, tmp_path
) -> None:
    store = ProfileStore(tmp_path / "profiles.json")
    service = make_service(es.EngineWorker(profiles=store))
    _loaded(qtbot, service, str(tiny.target), str(tiny.noisy))
    _, ends = _collect(service)
    short = GenerationParams(max_tokens=24, drafting=DraftSetting.of(None, 4))
    ids = [service.generate(_prompt(t), short, shared=True).request_id for t in ("cats", "dogs")]
    qtbot.waitUntil(lambda: all(i in ends for i in ids), timeout=30_000)
    raw = store.entry(str(tiny.target), str(tiny.noisy), kind="batch")
    assert raw is not None
    assert any(b == 2 for b, _ in BatchProfile.from_dict(raw).verify)  # two sequences' rounds


def test_a_reply_whose_kv_cache_does_not_fit_beside_the_running_ones_is_refused(
    qtbot: QtBot, make_service, tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = load_pair(tiny.target, tiny.noisy)
    need = es.reply_kv_bytes(pair, _prompt("cats"), LONG.max_tokens, batched=True)
    assert need > 0
    # Room for one reply's caches and a half: a lone reply always runs, a second does not fit.
    monkeypatch.setattr(es, "usable_memory_bytes", lambda: need * 3 // 2)
    service = make_service()
    _loaded(qtbot, service, str(tiny.target), str(tiny.noisy))
    first, second, ends = _second_while_first_runs(qtbot, service)
    refused = ends[second]
    assert isinstance(refused, EngineFailure) and refused.full
    assert "memory is full" in refused.message
    assert isinstance(ends[first], GenerationResult)  # the running reply ran on whole


def test_the_memory_fit_counts_the_copies_that_stacked_steps_and_side_by_side_caches_make(
    qtbot: QtBot, make_service, tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = load_pair(tiny.target, tiny.noisy)
    own = es.reply_kv_bytes(pair, _prompt("cats"), LONG.max_tokens)
    tokens = len(encode_chat(pair.target.tokenizer, _prompt("cats"))) + LONG.max_tokens
    assert pair.draft is not None
    draft = kv_cache_bytes(pair.draft.config, tokens)
    side = kv_cache_bytes(pair.target.config, tokens + ROOM)
    batched = es.reply_kv_bytes(pair, _prompt("cats"), LONG.max_tokens, batched=True)
    assert batched == own + SLACK * (draft + side)
    # Two replies' own caches fit, but not the stacks their caches are copied into.
    monkeypatch.setattr(es, "usable_memory_bytes", lambda: 2 * own)
    service = make_service()
    _loaded(qtbot, service, str(tiny.target), str(tiny.noisy))
    first, second, ends = _second_while_first_runs(qtbot, service)
    refused = ends[second]
    assert isinstance(refused, EngineFailure) and refused.full
    assert isinstance(ends[first], GenerationResult)


def test_kept_caches_of_finished_replies_give_way_before_a_refusal(
    qtbot: QtBot, make_service, tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = load_pair(tiny.target, tiny.noisy)
    need = es.reply_kv_bytes(pair, _prompt("cats"), LONG.max_tokens, batched=True)
    monkeypatch.setattr(es, "usable_memory_bytes", lambda: need * 3 // 2)
    forgotten: list[int] = []

    def forget(batch: Decoder) -> int:
        forgotten.append(1)
        return need  # as if the kept caches held a reply's worth

    monkeypatch.setattr(Decoder, "forget", forget)
    service = make_service()
    _loaded(qtbot, service, str(tiny.target), str(tiny.noisy))
    _, second, ends = _second_while_first_runs(qtbot, service)
    assert forgotten  # the kept caches went first
    assert isinstance(ends[second], GenerationResult)  # and then it fitted
