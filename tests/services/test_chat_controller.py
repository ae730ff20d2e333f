"""The window's reply life, outside the window: start, stream, saves, branches."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.engine.types import GenerationParams, Message
from app.services import (
    ChatController,
    EngineService,
    EngineWorker,
    Reply,
    ReplyEnded,
    ReplyFailure,
    ReplyGrowth,
    ReplySaved,
)
from app.store import Store
from tests.fakes import _fake_load, _loaded, _scripted


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path / "tandem.sqlite3")
    yield store
    store.close()


def _controller(qtbot: QtBot, make_service, store: Store, stream) -> ChatController:
    service: EngineService = make_service(EngineWorker(load=_fake_load, stream=stream))
    controller = ChatController(store, service)
    controller.set_pair(_loaded(qtbot, service, "/models/fake"))
    return controller


def _record(controller: ChatController) -> list[object]:
    events: list[object] = []
    for signal in (
        controller.started,
        controller.grew,
        controller.saved,
        controller.ended,
        controller.failed,
    ):
        signal.connect(events.append)
    return events


def test_a_reply_is_collected_once_and_saved_with_its_pair(
    qtbot: QtBot, make_service, store: Store
) -> None:
    controller = _controller(qtbot, make_service, store, _scripted(5))
    events = _record(controller)
    cid = store.create_conversation("Hi").id
    user = store.add_message(cid, "user", "Hello")
    with qtbot.waitSignal(controller.ended, timeout=5_000):
        started = controller.start(cid, GenerationParams(max_tokens=5))
        assert controller.busy and controller.reply == started
    assert not controller.busy and controller.reply is None
    assert events[0] == started and isinstance(started, Reply)
    assert (started.conversation_id, started.parent_id, started.upto) == (cid, user.id, None)
    growths = [e for e in events if isinstance(e, ReplyGrowth)]
    assert growths and all(g.conversation_id == cid for g in growths)
    grown = "".join(t for g in growths for _, t in g.segments)
    assert grown == "t0 t1 t2 t3 t4 "
    [saved] = [e for e in events if isinstance(e, ReplySaved)]
    assert saved.message is not None and saved.message.content == grown
    assert "".join(t for _, t in saved.message.segments) == grown
    assert (saved.finish_reason, saved.branched) == ("length", False)
    assert saved.message.parent_id == user.id and saved.message.target == "/models/fake"
    assert isinstance(events[-1], ReplyEnded) and events[-1].stats == saved.stats
    # What crosses to the window is frozen.
    with pytest.raises(dataclasses.FrozenInstanceError):
        saved.branched = True  # type: ignore[misc]


def test_the_history_is_the_system_prompt_then_the_branch_shown(
    qtbot: QtBot, make_service, store: Store
) -> None:
    controller = _controller(qtbot, make_service, store, _scripted(1))
    cid = store.create_conversation("Hi", system_prompt="Be brief.").id
    first = store.add_message(cid, "user", "One")
    store.add_message(cid, "assistant", "Two")
    assert controller.history(cid) == [
        Message("system", "Be brief."),
        Message("user", "One"),
        Message("assistant", "Two"),
    ]
    assert controller.history(cid, upto=first.id) == [
        Message("system", "Be brief."),
        Message("user", "One"),
    ]


def test_a_streaming_reply_is_saved_in_one_row_that_the_final_save_completes(
    qtbot: QtBot, make_service, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.services.chat_controller as chat_controller

    monkeypatch.setattr(chat_controller, "REPLY_SAVE_INTERVAL", 0.0)  # every batch
    controller = _controller(qtbot, make_service, store, _scripted(20, delay=0.01))
    cid = store.create_conversation("Hi").id
    store.add_message(cid, "user", "Hello")
    partial: list[tuple[int | None, str, str | None]] = []

    def seen(_growth: ReplyGrowth) -> None:
        reply = controller.reply
        assert reply is not None
        row = store.message(reply.message_id) if reply.message_id is not None else None
        partial.append(
            (reply.message_id, *((row.content, row.finish_reason) if row else ("", None)))
        )

    controller.grew.connect(seen)
    with qtbot.waitSignal(controller.saved, timeout=5_000) as blocker:
        controller.start(cid, GenerationParams(max_tokens=20))
    saved: ReplySaved = blocker.args[0]
    assert saved.message is not None
    # Each batch is told first, then saved: one row from the second batch on.
    assert len(partial) > 2 and {mid for mid, _, _ in partial[1:]} == {saved.message.id}
    assert all(reason == "error" for _, _, reason in partial[1:])  # interrupted until it ends
    assert all(b.startswith(a) for (_, a, _), (_, b, _) in itertools.pairwise(partial))
    assert [m.role for m in store.messages(cid)] == ["user", "assistant"]
    assert store.message(saved.message.id).finish_reason == "length"  # type: ignore[union-attr]


def test_a_regenerated_reply_is_a_new_branch(qtbot: QtBot, make_service, store: Store) -> None:
    controller = _controller(qtbot, make_service, store, _scripted(2))
    cid = store.create_conversation("Hi").id
    user = store.add_message(cid, "user", "Hello")
    old = store.add_message(cid, "assistant", "Old answer")
    with qtbot.waitSignal(controller.saved, timeout=5_000) as blocker:
        started = controller.start(cid, GenerationParams(max_tokens=2), parent_id=user.id)
    assert started.upto == user.id and started.parent_id == user.id
    saved: ReplySaved = blocker.args[0]
    assert saved.branched and saved.message is not None
    assert store.siblings(saved.message.id) == [old.id, saved.message.id]


def test_a_failed_reply_keeps_its_text_and_says_why(
    qtbot: QtBot, make_service, store: Store
) -> None:
    controller = _controller(qtbot, make_service, store, _scripted(5, fail_at=2))
    events = _record(controller)
    cid = store.create_conversation("Hi").id
    store.add_message(cid, "user", "Hello")
    with qtbot.waitSignal(controller.failed, timeout=5_000) as blocker:
        controller.start(cid, GenerationParams(max_tokens=5))
    failure: ReplyFailure = blocker.args[0]
    assert failure.conversation_id == cid and "out of memory" in failure.message
    [saved] = [e for e in events if isinstance(e, ReplySaved)]
    assert saved.message is not None and saved.message.content == "t0 t1 "
    assert saved.finish_reason == "error" and saved.stats is None
    ended = [e for e in events if isinstance(e, ReplyEnded)]
    assert len(ended) == 1 and ended[0].stats is None
    assert not controller.busy


def test_a_reply_whose_chat_was_deleted_is_not_saved(
    qtbot: QtBot, make_service, store: Store
) -> None:
    controller = _controller(qtbot, make_service, store, _scripted(100_000, delay=0.002))
    saved: list[ReplySaved] = []
    controller.saved.connect(saved.append)
    cid = store.create_conversation("Hi").id
    store.add_message(cid, "user", "Hello")
    with qtbot.waitSignal(controller.grew, timeout=5_000):
        controller.start(cid, GenerationParams(max_tokens=100_000))
    store.delete_conversation(cid)
    with qtbot.waitSignal(controller.ended, timeout=5_000):
        controller.cancel()
    assert saved == [] and store.conversation(cid) is None and not controller.busy


def test_another_callers_reply_is_not_the_controllers(
    qtbot: QtBot, make_service, store: Store
) -> None:
    service: EngineService = make_service(EngineWorker(load=_fake_load, stream=_scripted(3)))
    controller = ChatController(store, service)
    _loaded(qtbot, service, "/models/fake")
    events = _record(controller)
    with qtbot.waitSignal(service.generation_finished, timeout=5_000):
        service.generate([Message("user", "Hi")], GenerationParams(max_tokens=3))
    assert events == [] and store.conversations() == []


def test_stop_says_stopping_at_once_and_only_once(qtbot: QtBot, make_service, store: Store) -> None:
    from tests.fakes import _slow_to_stop

    controller = _controller(qtbot, make_service, store, _slow_to_stop())
    cid = store.create_conversation("Hi").id
    store.add_message(cid, "user", "Hello")
    stopping: list[Reply] = []
    controller.stopping.connect(stopping.append)
    with qtbot.waitSignal(controller.grew, timeout=5_000):
        controller.start(cid, GenerationParams(max_tokens=10_000))
    controller.cancel()
    controller.cancel()  # a second press says nothing new
    # Told before the engine's end arrives: the reply is still in flight.
    assert controller.busy and [r.stopping for r in stopping] == [True]
    assert controller.reply is not None and controller.reply.stopping
    with qtbot.waitSignal(controller.ended, timeout=5_000):
        pass
    assert len(stopping) == 1 and not controller.busy
    controller.cancel()  # nothing in flight: nothing to say
    assert len(stopping) == 1


def test_reading_the_prompt_is_the_replys_until_its_first_tokens(
    qtbot: QtBot, make_service, store: Store
) -> None:
    from app.engine.types import Reading
    from app.services import ReplyReading
    from tests.fakes import _reads_then_replies

    controller = _controller(qtbot, make_service, store, _reads_then_replies(1))
    cid = store.create_conversation("Hi").id
    store.add_message(cid, "user", "Hello")
    seen: list[tuple[ReplyReading, Reading | None]] = []
    controller.reading.connect(
        lambda r: seen.append((r, controller.reply.reading if controller.reply else None))
    )
    after: list[Reading | None] = []
    controller.grew.connect(lambda _g: after.append(controller.reply.reading))  # type: ignore[union-attr]
    with qtbot.waitSignal(controller.ended, timeout=5_000):
        controller.start(cid, GenerationParams())
    reading = Reading(0, 1_204, 0)
    assert seen == [(ReplyReading(cid, reading), reading)]
    assert after == [None]  # the first tokens end the reading
