from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from app.services import EngineService, EngineWorker
from app.store import SettingsFile, Store
from app.ui.main_window import MainWindow
from tests.conftest import TinyModels
from tests.services.test_engine_service import _fake_load, _scripted


@pytest.fixture
def make_window(qtbot: QtBot, tmp_path: Path) -> Iterator:
    made: list[tuple[MainWindow, EngineService, Store]] = []

    def make(worker: EngineWorker | None = None, library: tuple[Path, ...] = ()) -> MainWindow:
        models = tmp_path / "models"
        models.mkdir(exist_ok=True)
        for folder in library:
            shutil.copytree(folder, models / folder.name, dirs_exist_ok=True)
        store = Store(tmp_path / "tandem.sqlite3")
        service = EngineService(worker)
        window = MainWindow(
            store, service, SettingsFile(tmp_path / "settings.json"), models_dir=models
        )
        qtbot.addWidget(window)
        window.show()
        made.append((window, service, store))
        return window

    yield make
    for window, service, store in made:
        window.close()
        assert service.shutdown()
        store.close()


def _load(qtbot: QtBot, window: MainWindow, target: str, draft: str = "") -> None:
    window.model_bar.target_edit.setText(target)
    window.model_bar.draft_edit.setText(draft)
    with qtbot.waitSignal(window.service.pair_loaded, timeout=20_000):
        qtbot.mouseClick(window.model_bar.load_button, Qt.MouseButton.LeftButton)


def _send(qtbot: QtBot, window: MainWindow, text: str, timeout: int = 20_000) -> None:
    window.composer.editor.setPlainText(text)
    with qtbot.waitSignal(window.service.generation_finished, timeout=timeout):
        qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)


def test_reply_streams_in_and_is_saved(qtbot: QtBot, make_window, tiny: TinyModels) -> None:
    window = make_window()
    _load(qtbot, window, str(tiny.target), str(tiny.copy))
    assert window.pair_label.text() == "tiny-llama + tiny-copy"
    window.model_bar.k_spin.setValue(3)
    _send(qtbot, window, "Write a haiku about the sea.")

    [conversation] = window.store.conversations()
    assert conversation.title == "Write a haiku about the sea."
    user, reply = window.store.messages(conversation.id)
    assert user.content == "Write a haiku about the sea."
    assert reply.role == "assistant"
    assert reply.finish_reason in {"stop", "length"}
    assert reply.stats is not None and reply.stats.acceptance == 1.0
    assert reply.stats.num_draft == 3
    assert (reply.target, reply.draft) == (str(tiny.target), str(tiny.copy))
    shown = window.transcript.toPlainText()
    assert "Write a haiku about the sea." in shown
    assert shown.rstrip().endswith(reply.content.rstrip())
    assert "tok/s" in window.tps_label.text()
    assert window.acceptance_label.text().startswith("100% accepted")
    assert window.composer.editor.toPlainText() == ""
    assert window.composer.send_button.isEnabled()


def test_new_window_on_the_same_database_shows_the_chat(
    qtbot: QtBot, make_window, tiny: TinyModels
) -> None:
    first = make_window()
    _load(qtbot, first, str(tiny.target))
    _send(qtbot, first, "Hello there")
    reply = first.store.messages(first.store.conversations()[0].id)[-1].content
    first.close()

    second = make_window()
    assert second.conversations.rowCount() == 1
    assert second.conversation_list.currentIndex().row() == 0
    assert "Hello there" in second.transcript.toPlainText()
    assert reply.strip() in second.transcript.toPlainText()
    # The pair is remembered for the next start.
    assert second.model_bar.target_edit.text() == str(tiny.target)


def test_ctrl_return_sends(qtbot: QtBot, make_window, tiny: TinyModels) -> None:
    window = make_window()
    _load(qtbot, window, str(tiny.target))
    window.composer.editor.setPlainText("Hi")
    window.composer.editor.setFocus()
    with qtbot.waitSignal(window.service.generation_finished, timeout=20_000):
        qtbot.keyClick(
            window.composer.editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier
        )
    assert len(window.store.conversations()) == 1


def test_sending_without_a_model_explains(qtbot: QtBot, make_window, tiny: TinyModels) -> None:
    window = make_window(library=(tiny.target,))  # models, but none loaded
    assert window.onboarding is None
    window.composer.editor.setPlainText("Hello")
    qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
    assert window.error_banner.isVisible()
    assert "Load a target model first" in window.error_banner.text()
    assert window.composer.editor.toPlainText() == "Hello"  # nothing lost
    assert window.store.conversations() == []


def test_bad_folder_shows_a_reason(qtbot: QtBot, make_window, tmp_path: Path) -> None:
    window = make_window()
    window.model_bar.target_edit.setText(str(tmp_path / "nope"))
    with qtbot.waitSignal(window.service.failed, timeout=10_000):
        qtbot.mouseClick(window.model_bar.load_button, Qt.MouseButton.LeftButton)
    assert "no such folder" in window.error_banner.text()
    assert window.model_bar.load_button.isEnabled()
    assert window.pair_label.text() == "No model loaded"


def test_engine_error_is_shown_and_the_app_stays_up(qtbot: QtBot, make_window) -> None:
    window = make_window(EngineWorker(load=_fake_load, stream=_scripted(10, fail_at=2)))
    _load(qtbot, window, "/models/fake")
    window.composer.editor.setPlainText("Hello")
    with qtbot.waitSignal(window.service.failed, timeout=5_000):
        qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
    assert window.isVisible()
    assert window.error_banner.isVisible()
    assert "out of memory" in window.error_banner.text()
    assert window.composer.send_button.isEnabled()
    _user, partial = window.store.messages(window.store.conversations()[0].id)
    assert (partial.content, partial.finish_reason) == ("t0 t1 ", "error")
    assert "Interrupted by an error." in window.transcript.toPlainText()


def test_stop_keeps_the_reply_so_far(qtbot: QtBot, make_window) -> None:
    window = make_window(EngineWorker(load=_fake_load, stream=_scripted(100_000, delay=0.002)))
    _load(qtbot, window, "/models/fake")
    window.composer.editor.setPlainText("Tell me everything")
    with qtbot.waitSignal(window.service.tokens_generated, timeout=5_000):
        qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
    assert window.composer.stop_button.isEnabled()
    with qtbot.waitSignal(window.service.generation_finished, timeout=5_000):
        qtbot.keyClick(window.composer.editor, Qt.Key.Key_Escape)
    reply = window.store.messages(window.store.conversations()[0].id)[-1]
    assert reply.finish_reason == "cancelled"
    assert reply.content.startswith("t0 t1 ")
    assert "Stopped." in window.transcript.toPlainText()
    assert not window.composer.stop_button.isEnabled()


def test_delete_conversation_after_confirmation(
    qtbot: QtBot, make_window, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = make_window(EngineWorker(load=_fake_load, stream=_scripted(3)))
    _load(qtbot, window, "/models/fake")
    _send(qtbot, window, "first")
    window._on_new_conversation_requested()
    _send(qtbot, window, "second")
    assert window.conversations.rowCount() == 2

    monkeypatch.setattr(QMessageBox, "question", lambda *_a: QMessageBox.StandardButton.Cancel)
    qtbot.mouseClick(window.delete_button, Qt.MouseButton.LeftButton)
    assert window.conversations.rowCount() == 2

    monkeypatch.setattr(QMessageBox, "question", lambda *_a: QMessageBox.StandardButton.Yes)
    qtbot.mouseClick(window.delete_button, Qt.MouseButton.LeftButton)
    assert [c.title for c in window.store.conversations()] == ["first"]
    assert "first" in window.transcript.toPlainText()


def test_switching_conversations_shows_their_messages(qtbot: QtBot, make_window) -> None:
    window = make_window(EngineWorker(load=_fake_load, stream=_scripted(2)))
    _load(qtbot, window, "/models/fake")
    _send(qtbot, window, "alpha")
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.transcript.toPlainText() == ""
    _send(qtbot, window, "beta")
    window.conversation_list.setCurrentIndex(window.conversations.index(1, 0))
    assert "alpha" in window.transcript.toPlainText()
    assert "beta" not in window.transcript.toPlainText()


def test_auto_k_and_lookup_reach_the_engine_and_are_remembered(
    qtbot: QtBot, make_window, tiny: TinyModels
) -> None:
    window = make_window()
    _load(qtbot, window, str(tiny.target), str(tiny.copy))
    window.model_bar.auto_check.setChecked(True)
    window.model_bar.lookup_check.setChecked(True)
    assert not window.model_bar.k_spin.isEnabled()
    _send(qtbot, window, "Repeat: one two three, one two three")
    reply = window.store.messages(window.store.conversations()[0].id)[-1]
    assert reply.stats is not None
    assert reply.stats.num_draft is None
    assert 1 <= reply.stats.k_min <= reply.stats.k_max
    assert reply.stats.drafted > 0
    assert reply.stats.speedup is not None, reply.stats
    assert "× plain" in window.tps_label.text()
    window.close()
    again = make_window()
    assert again.model_bar.auto_check.isChecked()
    assert again.model_bar.lookup_check.isChecked()


def test_format_stats() -> None:
    from app.engine.types import Stats
    from app.ui.main_window import format_stats

    plain = Stats(tokens=10, generation_seconds=2.0)
    assert format_stats(plain) == ("5.0 tok/s", "no drafting")
    spec = Stats(
        tokens=30,
        drafted=20,
        accepted=15,
        k_min=2,
        k_max=5,
        generation_seconds=3.0,
        baseline_tps=5.0,
    )
    assert format_stats(spec) == ("10.0 tok/s (2.00× plain)", "75% accepted (15/20), k 2–5")


def test_model_manager_loads_the_chosen_pair(
    qtbot: QtBot, make_window, tiny: TinyModels, tmp_path: Path
) -> None:
    import shutil

    window = make_window()
    models = tmp_path / "models"
    shutil.copytree(tiny.target, models / "tiny-llama")
    window._models_dir = models
    dialog = window.open_model_manager()
    assert dialog.isVisible()
    dialog.table.selectRow(0)
    qtbot.mouseClick(dialog.target_button, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(window.service.pair_loaded, timeout=20_000):
        qtbot.mouseClick(dialog.load_button, Qt.MouseButton.LeftButton)
    assert window.model_bar.target_edit.text() == str(models / "tiny-llama")
    assert window.pair_label.text() == "tiny-llama"


def test_loading_a_pair_stops_the_reply_first(qtbot: QtBot, make_window) -> None:
    window = make_window(EngineWorker(load=_fake_load, stream=_scripted(100_000, delay=0.002)))
    _load(qtbot, window, "/models/first")
    window.composer.editor.setPlainText("Long answer please")
    with qtbot.waitSignal(window.service.tokens_generated, timeout=5_000):
        qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
    window.model_bar.target_edit.setText("/models/second")
    with qtbot.waitSignals(
        [window.service.generation_finished, window.service.pair_loaded], timeout=5_000
    ):
        qtbot.mouseClick(window.model_bar.load_button, Qt.MouseButton.LeftButton)
    reply = window.store.messages(window.store.conversations()[0].id)[-1]
    assert reply.finish_reason == "cancelled"
    assert window.pair_label.text() == "second"


def test_loading_shows_its_steps_in_the_status_bar(
    qtbot: QtBot, make_window, tiny: TinyModels
) -> None:
    window = make_window()
    texts: list[str] = []
    window.service.load_progressed.connect(lambda _p: texts.append(window.pair_label.text()))
    window.model_bar.target_edit.setText(str(tiny.target))
    window.model_bar.draft_edit.setText(str(tiny.copy))
    with qtbot.waitSignal(window.service.pair_loaded, timeout=20_000):
        qtbot.mouseClick(window.model_bar.load_button, Qt.MouseButton.LeftButton)
        assert window.load_progress.isVisible()
    qtbot.waitUntil(lambda: len(texts) == 4)
    assert texts == [
        "Checking memory…",
        "Loading tiny-llama…",
        "Loading tiny-copy…",
        "Checking the pair…",
    ]
    assert not window.load_progress.isVisible()
    assert window.pair_label.text() == "tiny-llama + tiny-copy"
