"""Hub tasks that belong together: only their own news, and all or nothing."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from app.services.hub_service import HubFailure, HubProgress, HubResult
from app.services.hub_tasks import GroupProgress, HubTaskGroup
from tests.ui.conftest import FakeHub


def test_a_group_passes_on_its_own_progress_and_ends_with_every_path(
    qtbot: QtBot, tmp_path: Path
) -> None:
    hub = FakeHub()
    hub.start("download", "someone/else", tmp_path)  # another caller's task, id 1
    group = HubTaskGroup(hub, tmp_path)  # type: ignore[arg-type]
    progress: list[GroupProgress] = []
    finished: list[tuple[str, ...]] = []
    group.progressed.connect(progress.append)
    group.finished.connect(finished.append)
    group.start([("download", "org/target"), ("import-folder", "/tmp/draft")])
    assert [s[:2] for s in hub.started[1:]] == [
        ("download", "org/target"),
        ("import-folder", "/tmp/draft"),
    ]
    assert group.running
    hub.progressed.emit(HubProgress(1, "not ours", 1, 2))
    hub.progressed.emit(HubProgress(3, "draft half", 1, 2))
    assert [(p.step, p.steps, p.fraction, p.text) for p in progress] == [(2, 2, 0.5, "draft half")]
    hub.finished.emit(HubResult(3, "/m/draft"))
    assert finished == []  # the target is still to come
    hub.finished.emit(HubResult(2, "/m/target"))
    assert finished == [("/m/target", "/m/draft")]  # in the order they were started
    assert not group.running


def test_when_one_task_fails_the_others_are_cancelled(qtbot: QtBot, tmp_path: Path) -> None:
    hub = FakeHub()
    group = HubTaskGroup(hub, tmp_path)  # type: ignore[arg-type]
    failed: list[str] = []
    group.failed.connect(failed.append)
    group.start([("download", "org/target"), ("download", "org/draft")])
    hub.failed.emit(HubFailure(1, "No network."))
    assert failed == ["No network."] and hub.cancelled == [2]
    assert not group.running
    hub.finished.emit(HubResult(2, "/m/draft"))  # forgotten: nothing more is said
    assert failed == ["No network."]
