from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from app.engine.types import DraftSetting, Origin, Stats
from app.services import EngineWorker
from app.store import SettingsFile
from app.store.calibrations import CalibrationsFile
from app.ui.main_window import TUNE_KS, MainWindow
from tests.conftest import TinyModels
from tests.fakes import _fake_load, _load, _rounds, _scripted, _send


@pytest.fixture
def timed_short_replies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gives the short scripted replies below a speedup, so one value can be followed
    everywhere (replies too short to time have their own tests)."""
    import app.engine.types

    monkeypatch.setattr(app.engine.types, "MIN_TIMED_TOKENS", 1)


def _shown(markdown: str) -> str:
    """A reply's text as the transcript shows it, rendered from Markdown."""
    from PySide6.QtGui import QTextDocument

    from app.ui.markdown import render_markdown

    doc = QTextDocument()
    doc.setHtml(render_markdown(markdown).html)
    return doc.toPlainText().strip()


def test_reply_streams_in_and_is_saved(qtbot: QtBot, make_window, tiny: TinyModels) -> None:
    window = make_window()
    _load(qtbot, window, str(tiny.target), str(tiny.copy))
    assert window.status.pair.text() == "tiny-llama + tiny-copy"
    window.panel.set_num_draft(3)
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
    # The reply as Markdown renders it, then its actions.
    footer = "\nCopy · Regenerate · Delete · Stats…"
    assert shown.endswith(footer)
    assert shown.removesuffix(footer).rstrip().endswith(_shown(reply.content))
    assert "tok/s" in window.status.speed.text()
    assert window.status.acceptance.text().startswith("100% accepted")
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
    assert second.chats.conversations.rowCount() == 1
    assert second.chats.conversation_list.currentIndex().row() == 0
    assert "Hello there" in second.transcript.toPlainText()
    assert _shown(reply) in second.transcript.toPlainText()
    # The pair is remembered for the next start.
    assert second.model_bar.target() == str(tiny.target)


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
    qtbot.waitUntil(lambda: window.onboarding is None, timeout=10_000)  # once scanned
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
    assert window.status.pair.text() == "No model loaded"


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
    window.chats.new_requested.emit()
    _send(qtbot, window, "second")
    assert window.chats.conversations.rowCount() == 2

    monkeypatch.setattr(QMessageBox, "question", lambda *_a: QMessageBox.StandardButton.Cancel)
    qtbot.mouseClick(window.chats.delete_button, Qt.MouseButton.LeftButton)
    assert window.chats.conversations.rowCount() == 2

    monkeypatch.setattr(QMessageBox, "question", lambda *_a: QMessageBox.StandardButton.Yes)
    qtbot.mouseClick(window.chats.delete_button, Qt.MouseButton.LeftButton)
    assert [c.title for c in window.store.conversations()] == ["first"]
    assert "first" in window.transcript.toPlainText()


def test_switching_conversations_shows_their_messages(qtbot: QtBot, make_window) -> None:
    window = make_window(EngineWorker(load=_fake_load, stream=_scripted(2)))
    _load(qtbot, window, "/models/fake")
    _send(qtbot, window, "alpha")
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.transcript.toPlainText() == ""
    _send(qtbot, window, "beta")
    window.chats.conversation_list.setCurrentIndex(window.chats.conversations.index(1, 0))
    assert "alpha" in window.transcript.toPlainText()
    assert "beta" not in window.transcript.toPlainText()


def test_auto_k_and_lookup_reach_the_engine_and_are_remembered(
    qtbot: QtBot, make_window, tiny: TinyModels
) -> None:
    window = make_window()
    _load(qtbot, window, str(tiny.target), str(tiny.copy))
    window.panel.auto_check.setChecked(True)
    window.model_bar.lookup_check.setChecked(True)
    assert not window.panel.k_slider.isEnabled()
    _send(qtbot, window, "Repeat: one two three, one two three")
    reply = window.store.messages(window.store.conversations()[0].id)[-1]
    assert reply.stats is not None
    assert reply.stats.num_draft is None
    assert 1 <= reply.stats.k_min <= reply.stats.k_max
    assert reply.stats.drafted > 0
    assert reply.stats.speedup is not None, reply.stats
    assert "× plain" in window.status.speed.text()
    window.close()
    again = make_window()
    assert again.panel.auto_check.isChecked()
    assert again.model_bar.lookup_check.isChecked()


def test_format_stats() -> None:
    from app.engine.types import Stats
    from app.ui.statusbar import format_stats

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

    window = make_window()
    models = window.models_dir()
    shutil.copytree(tiny.target, models / "tiny-llama")
    dialog = window.open_model_manager()
    assert dialog.isVisible()
    qtbot.waitUntil(lambda: not dialog.scanning, timeout=10_000)
    dialog.table.selectRow(0)
    qtbot.mouseClick(dialog.target_button, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(window.service.pair_loaded, timeout=20_000):
        qtbot.mouseClick(dialog.load_button, Qt.MouseButton.LeftButton)
    assert window.model_bar.target() == str(models / "tiny-llama")
    assert window.status.pair.text() == "tiny-llama"
    # Chosen again, the loaded target is in memory already: its memory bar counts it once.
    again = window.open_model_manager()
    qtbot.waitUntil(lambda: not again.scanning, timeout=10_000)
    again.table.selectRow(0)
    qtbot.mouseClick(again.target_button, Qt.MouseButton.LeftButton)
    fit = again.memory_bar.fit
    assert fit is not None and fit.reused_bytes == fit.held_bytes > 0


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
    assert window.status.pair.text() == "second"


def test_loading_shows_its_steps_in_the_status_bar(
    qtbot: QtBot, make_window, tiny: TinyModels
) -> None:
    window = make_window()
    texts: list[str] = []
    window.service.load_progressed.connect(lambda _p: texts.append(window.status.pair.text()))
    window.model_bar.target_edit.setText(str(tiny.target))
    window.model_bar.draft_edit.setText(str(tiny.copy))
    with qtbot.waitSignal(window.service.pair_loaded, timeout=20_000):
        qtbot.mouseClick(window.model_bar.load_button, Qt.MouseButton.LeftButton)
        assert window.status.load_progress.isVisible()
    qtbot.waitUntil(lambda: "Loading tiny-copy…" in texts)
    # Each model's weights are counted as they are read (the tiny ones in one go).
    import re

    patterns = [
        "Checking memory…",
        "Checking the pair…",  # before any weight is read
        "Loading tiny-llama…",
        r"Loading tiny-llama: 0 B of (\d+\.\d) KB…",
        r"Loading tiny-llama: (\d+\.\d) of \1 KB…",
        "Loading tiny-copy…",
        r"Loading tiny-copy: 0 B of (\d+\.\d) KB…",
        r"Loading tiny-copy: (\d+\.\d) of \1 KB…",
    ]
    assert len(texts) == len(patterns)
    assert all(re.fullmatch(p, t) for p, t in zip(patterns, texts, strict=True)), texts
    assert not window.status.load_progress.isVisible()
    assert window.status.pair.text() == "tiny-llama + tiny-copy"


# Speculation panel, colouring and stats, driven by a scripted engine.


def test_gauge_shows_the_rounds_the_engine_sent(
    qtbot: QtBot, make_window, timed_short_replies: None
) -> None:
    window = make_window(EngineWorker(load=_fake_load, stream=_rounds()))
    _load(qtbot, window, "/m/target", "/m/draft")
    _send(qtbot, window, "Hello")
    snap = window.panel.gauge.snapshot()
    assert snap is not None
    # 6 of 12 drafted tokens accepted; 10 tokens in 0.04 s against a 50 tok/s baseline.
    assert snap.message_acceptance == 0.5 and snap.rolling_acceptance == 0.5
    assert snap.tokens == 10 and abs(snap.tps - 250.0) < 1e-6
    assert snap.position_acceptance[:4] == (2 / 3, 2 / 3, 1 / 3, 1 / 3)
    summary = window.panel.gauge.summary()
    assert summary.startswith("Acceptance 50% this reply (recent 50%, lifetime 50%)")
    assert "250.0 tok/s" in summary and "5.00× plain" in summary


def test_reply_is_coloured_by_origin_and_keeps_its_colours(qtbot: QtBot, make_window) -> None:
    from PySide6.QtGui import QTextCursor

    from app.ui.transcript import ORIGIN_COLORS

    window = make_window(EngineWorker(load=_fake_load, stream=_rounds()))
    _load(qtbot, window, "/m/target", "/m/draft")
    _send(qtbot, window, "Hello")

    def background_of(word: str) -> object:
        doc = window.transcript.document()
        cursor = doc.find(word)
        assert not cursor.isNull(), word
        c = QTextCursor(doc)
        c.setPosition(cursor.selectionStart() + 1)
        fmt = c.charFormat()
        return fmt.background().color() if fmt.hasProperty(fmt.Property.BackgroundBrush) else None

    assert background_of("r0t0") == ORIGIN_COLORS[Origin.DRAFT]
    assert background_of("r0t4") == ORIGIN_COLORS[Origin.BONUS]
    assert background_of("r1t2") == ORIGIN_COLORS[Origin.CORRECTION]
    assert background_of("r3t0") is None  # a plain target step
    [conversation] = window.store.conversations()
    reply = window.store.messages(conversation.id)[1]
    assert "".join(t for _, t in reply.segments) == reply.content
    # Shown again from the store, with the same colours; the toggle turns them off.
    window.chats.new_requested.emit()  # away, and back to the chat
    window.chats.select(conversation.id)
    assert background_of("r1t2") == ORIGIN_COLORS[Origin.CORRECTION]
    window.panel.colour_check.setChecked(False)
    assert background_of("r1t2") is None
    assert (
        window.settings_file_colour() is False if hasattr(window, "settings_file_colour") else True
    )


def test_k_slider_applies_to_the_reply_in_flight(qtbot: QtBot, make_window) -> None:
    import threading

    seen: list[int | None] = []
    gate = threading.Event()

    def hold(i: int) -> None:
        if i == 2:  # the UI changes k while the third round waits
            gate.wait(5)

    window = make_window(EngineWorker(load=_fake_load, stream=_rounds(seen_k=seen, hold=hold)))
    _load(qtbot, window, "/m/target", "/m/draft")
    window.panel.set_num_draft(4)
    window.composer.editor.setPlainText("Hello")
    with qtbot.waitSignal(window.service.generation_finished, timeout=10_000):
        qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: len(seen) >= 2)
        window.panel.k_slider.setValue(7)
        window.panel.auto_check.setChecked(True)
        gate.set()
    assert seen[0] == 4 and seen[-1] is None
    assert window.panel.k_value.text() == "auto"  # no round since said Auto chose its k
    assert window.settings.drafting == DraftSetting(7, auto=True)


def test_a_new_install_drafts_with_auto_up_to_16(qtbot: QtBot, make_window) -> None:
    seen: list[int | None] = []
    window = make_window(EngineWorker(load=_fake_load, stream=_rounds(seen_k=seen)))
    assert window.panel.auto_check.isChecked() and not window.panel.k_slider.isEnabled()
    assert window.panel.k_slider.maximum() == 16
    assert window.panel.k_slider.value() == 4  # the fixed k, for when Auto is turned off
    assert window.panel.k_value.text() == "auto"
    _load(qtbot, window, "/m/target", "/m/draft")
    _send(qtbot, window, "Hello")
    assert seen and set(seen) == {None}  # the engine plans every round
    assert window.params().drafting.num_draft is None and window.params().drafting.limit == 16


def test_the_k_label_shows_what_auto_chose_while_a_reply_streams(qtbot: QtBot, make_window) -> None:
    import threading

    gate = threading.Event()

    def hold(i: int) -> None:
        if i == 2:  # the UI looks while the third round waits
            gate.wait(5)

    # Auto drafts 8, then 5, then a plain step (k = 0) that says nothing of Auto's k.
    script = ((8, 8), (5, 2), (0, 0))
    worker = EngineWorker(
        load=_fake_load, stream=_rounds(script, hold=hold, auto=True), flush_interval=0.0
    )
    window = make_window(worker)
    _load(qtbot, window, "/m/target", "/m/draft")
    assert window.panel.k_value.text() == "auto"  # before any round
    window.composer.editor.setPlainText("Hello")
    with qtbot.waitSignal(window.service.generation_finished, timeout=10_000):
        qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: window.panel.k_value.text() == "auto: 5", timeout=5_000)
        gate.set()
    assert window.panel.k_value.text() == "auto: 5"  # the plain step left it alone
    # A fixed k reads as itself; Auto again starts from "auto".
    window.panel.set_num_draft(3)
    assert window.panel.k_value.text() == "k: 3"
    window.panel.auto_check.setChecked(True)
    assert window.panel.k_value.text() == "auto"
    # A newly loaded pair forgets the last one's choice.
    window.panel.show_auto_k(9)
    _load(qtbot, window, "/m/other", "/m/draft")
    assert window.panel.k_value.text() == "auto"


def test_rounds_auto_did_not_plan_leave_the_k_label_alone(qtbot: QtBot, make_window) -> None:
    # Rounds of a fixed k, as right after Auto is turned on mid-reply.
    window = make_window(EngineWorker(load=_fake_load, stream=_rounds(), flush_interval=0.0))
    _load(qtbot, window, "/m/target", "/m/draft")
    assert window.panel.drafting().num_draft is None
    _send(qtbot, window, "Hello")
    assert window.panel.k_value.text() == "auto"
    window.panel.set_num_draft(4)
    _send(qtbot, window, "Hello again")
    assert window.panel.k_value.text() == "k: 4"


def test_stats_link_opens_the_replys_statistics(
    qtbot: QtBot, make_window, timed_short_replies: None
) -> None:
    from PySide6.QtCore import QUrl

    from app.ui.stats_popover import StatsPopover

    window = make_window(EngineWorker(load=_fake_load, stream=_rounds()))
    _load(qtbot, window, "/m/target", "/m/draft")
    _send(qtbot, window, "Hello")
    [conversation] = window.store.conversations()
    reply = window.store.messages(conversation.id)[1]
    window.transcript.anchorClicked.emit(QUrl(f"stats:{reply.id}"))
    [popover] = window.findChildren(StatsPopover)
    rows = dict(popover.rows)
    assert rows["Acceptance"] == "50% (6 of 12)"
    assert rows["Tokens per target call"] == "2.50"
    assert rows["Speed-up"] == "5.00× plain"
    assert rows["Pair"] == "target + draft"
    popover.close()


def test_hiding_the_panel_stops_gauge_updates(qtbot: QtBot, make_window) -> None:
    window = make_window(EngineWorker(load=_fake_load, stream=_rounds()))
    _load(qtbot, window, "/m/target", "/m/draft")
    window.menus.panel_action.setChecked(False)
    assert not window.panel.isVisible()
    before = window.panel.gauge.snapshot()
    _send(qtbot, window, "Hello")
    assert window.panel.gauge.snapshot() is before  # no repaint work while hidden
    window.menus.panel_action.setChecked(True)
    snap = window.panel.gauge.snapshot()
    assert snap is not None and snap.message_acceptance == 0.5


def test_tune_runs_a_sweep_and_its_best_k_is_used_only_when_asked(
    qtbot: QtBot, make_window, tiny: TinyModels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.engine import calibrate
    from app.store import pair_key

    # Two of the built-in prompts: every k still runs on more than one.
    builtin = calibrate.default_prompts()
    monkeypatch.setattr(calibrate, "default_prompts", lambda: builtin[:2])
    window = make_window()
    _load(qtbot, window, str(tiny.target), str(tiny.copy))
    dialog = window.open_tune_dialog()
    assert dialog is not None
    with qtbot.waitSignal(window.service.calibration_finished, timeout=120_000) as blocker:
        qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
        assert window.service.busy and not window.composer.send_button.isEnabled()
    result = blocker.args[0]
    assert [p.k for p in result.points] == [0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, None]
    assert list(TUNE_KS) == [p.k for p in result.points]
    # Costs of verifying 1 … 17 tokens were measured first, and charted.
    assert result.profile is not None and result.profile.widths == 17 and result.k_max == 16
    assert dialog.charts.cost_series.count() == 17
    assert dialog.plan_label.text().startswith("Auto picks k = ")
    key = pair_key(str(tiny.target), str(tiny.copy))
    assert window.settings.best_k == {}  # a sweep alone changes no setting
    assert dialog.calibration == result
    png = tmp_path / "sweep.png"
    assert dialog.export_png(str(png)) and png.stat().st_size > 1000
    assert window.composer.send_button.isEnabled()
    # Tune… opened again for the pair shows this sweep, from the data folder.
    dialog.close()
    again = window.open_tune_dialog()
    assert again is not dialog and again.calibration == result
    assert again.status.text().startswith("Last sweep of this pair")
    assert CalibrationsFile(tmp_path / "calibrations.json").get(*key.split("|")) == result
    # Use Best k makes it the pair's fixed k, now and the next time the pair loads.
    again.use_button.click()
    assert window.settings.best_k == {key: result.best_k}
    assert SettingsFile(tmp_path / "settings.json").load().best_k == {key: result.best_k}
    window.panel.set_num_draft(12)
    _load(qtbot, window, str(tiny.target), str(tiny.copy))
    assert window.panel.drafting().num_draft == result.best_k


def test_tune_reopens_with_the_pairs_last_result(qtbot: QtBot, make_window, tmp_path: Path) -> None:
    from tests.fakes import PROFILED

    CalibrationsFile(tmp_path / "calibrations.json").put("/m/target", "/m/draft", PROFILED)
    window = make_window(EngineWorker(load=_fake_load, stream=_rounds()))
    _load(qtbot, window, "/m/target", "/m/draft")
    dialog = window.open_tune_dialog()
    assert dialog.calibration == PROFILED
    assert dialog.charts.cost_series.count() == 17
    assert dialog.plan_label.text().startswith("Auto picks k = 7: 8 tokens verify for 1.7 steps")
    dialog.close()
    _load(qtbot, window, "/m/other", "/m/draft")  # another pair: nothing to show yet
    other = window.open_tune_dialog()
    assert other.calibration is None and other.charts.cost_series.count() == 0


def test_a_calibrated_pair_keeps_auto_on_with_its_best_k_as_the_fixed_one(
    qtbot: QtBot, make_window, tmp_path: Path
) -> None:
    from app.store import Settings, pair_key

    best = {pair_key("/m/target", "/m/draft"): 6}
    SettingsFile(tmp_path / "settings.json").save(Settings(best_k=best))
    window = make_window(EngineWorker(load=_fake_load, stream=_rounds()))
    _load(qtbot, window, "/m/target", "/m/draft")
    assert window.panel.drafting().num_draft is None and window.panel.k_slider.value() == 6
    window.panel.auto_check.setChecked(False)
    assert window.panel.drafting().num_draft == 6


def test_tune_needs_a_pair_with_a_draft(qtbot: QtBot, make_window, tiny: TinyModels) -> None:
    window = make_window(library=(tiny.target,))
    assert window.open_tune_dialog() is None
    assert window.error_banner.text().startswith("Load a model pair first")
    _load(qtbot, window, str(tiny.target))
    assert window.open_tune_dialog() is None
    assert window.error_banner.text().startswith("Tuning needs a draft model")


def test_menus_follow_mac_conventions(qtbot: QtBot, make_window) -> None:
    from PySide6.QtGui import QAction, QKeySequence

    window = make_window()
    titles = [a.text() for a in window.menuBar().actions()]
    assert titles == ["&File", "&Edit", "&View", "&Window", "&Help"]
    actions = {a.text(): a for a in window.findChildren(QAction)}
    keys = QKeySequence.StandardKey
    assert actions["&New Chat"].shortcut() == QKeySequence(keys.New)
    assert not actions["Settings…"].shortcut().isEmpty()  # Ctrl+, where Qt has no key
    assert actions["Settings…"].menuRole() == QAction.MenuRole.PreferencesRole
    assert actions["&Quit Tandem"].menuRole() == QAction.MenuRole.QuitRole
    assert actions["&About Tandem"].menuRole() == QAction.MenuRole.AboutRole
    assert actions["&Minimize"].shortcut() == QKeySequence("Ctrl+M")
    assert actions["&Copy"].shortcut() == QKeySequence(keys.Copy)


def test_edit_menu_acts_on_the_focused_field(
    qtbot: QtBot, make_window, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtGui import QAction
    from PySide6.QtWidgets import QApplication

    window = make_window()
    actions = {a.text(): a for a in window.findChildren(QAction)}
    editor = window.composer.editor
    editor.setPlainText("draft text")
    # Offscreen windows do not take focus; stand in for the focused widget.
    monkeypatch.setattr(QApplication, "focusWidget", staticmethod(lambda: editor))
    actions["Select &All"].trigger()
    assert editor.textCursor().selectedText() == "draft text"
    actions["Cu&t"].trigger()
    assert editor.toPlainText() == ""
    actions["&Undo"].trigger()
    assert editor.toPlainText() == "draft text"


def test_settings_change_the_sampling_of_the_next_reply(
    qtbot: QtBot, make_window, tmp_path: Path
) -> None:
    from app.store import Settings

    window = make_window()
    dialog = window.open_settings()
    changed = Settings(
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        min_p=0.02,
        repetition_penalty=1.2,
        max_tokens=99,
        seed=5,
    )
    dialog.settings_changed.emit(changed)
    p = window.params()
    assert (
        p.temperature,
        p.top_p,
        p.top_k,
        p.min_p,
        p.repetition_penalty,
        p.max_tokens,
        p.seed,
    ) == (0.7, 0.9, 20, 0.02, 1.2, 99, 5)
    assert SettingsFile(tmp_path / "settings.json").load().seed == 5
    dialog.close()


def test_clear_all_data_deletes_conversations_and_resets_settings(
    qtbot: QtBot, make_window, tmp_path: Path
) -> None:
    window = make_window(EngineWorker(load=_fake_load, stream=_rounds()))
    _load(qtbot, window, "/m/target", "/m/draft")
    _send(qtbot, window, "Hello")
    assert window.store.conversations()
    dialog = window.open_settings()
    dialog.clear_data_requested.emit()  # Clear All Data…, confirmed
    dialog.close()
    assert window.store.conversations() == [] and window.chats.conversations.rowCount() == 0
    assert SettingsFile(tmp_path / "settings.json").load().target is None


def test_context_indicator_fills_and_warns(qtbot: QtBot, make_window, monkeypatch) -> None:
    from app.services import PairInfo, ReplyEnded

    window = make_window(EngineWorker(load=_fake_load, stream=_rounds()))
    _load(qtbot, window, "/m/target", "/m/draft")
    assert window.status.context.text() == ""  # the fake pair has no known window
    # The engine says the pair's window; replies end with the conversation filling it.
    window.service.pair_loaded.emit(PairInfo("/m/target", "/m/draft", "t + d", context_length=1000))
    window.chat.ended.emit(ReplyEnded(request_id=1, stats=None, context_tokens=120))
    assert window.status.context.text() == "Context 120 / 1,000"
    assert "12%" in window.status.context.toolTip()
    window.chat.ended.emit(ReplyEnded(request_id=2, stats=None, context_tokens=900))
    assert "start a new chat" in window.status.context.toolTip()
    window.chats.new_requested.emit()
    assert window.status.context.text() == "Context 0 / 1,000"


def test_the_chat_view_says_which_chat_is_on_show(qtbot: QtBot, make_window) -> None:
    window = make_window(EngineWorker(load=_fake_load, stream=_rounds()))
    assert window.chat_view.conversation_id is None and window.chat_view.context_used == 0
    _load(qtbot, window, "/m/target", "/m/draft")
    _send(qtbot, window, "Hello")
    assert window.chat_view.conversation_id == window.store.conversations()[0].id
    window.chats.new_requested.emit()
    assert window.chat_view.conversation_id is None and window.chat_view.context_used == 0


def _assistant_rows(window: MainWindow) -> list:
    """Every assistant message in the database, oldest first."""
    cid = window.store.conversations()[0].id
    return [m for m in window.store._tree(cid) if m.role == "assistant"]


def test_a_streaming_reply_is_saved_as_it_grows(
    qtbot: QtBot, make_window, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.services.chat_controller as chat_controller

    monkeypatch.setattr(chat_controller, "REPLY_SAVE_INTERVAL", 0.05)
    window = make_window(EngineWorker(load=_fake_load, stream=_scripted(100_000, delay=0.002)))
    _load(qtbot, window, "/models/fake")
    window.composer.editor.setPlainText("Tell me everything")
    qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
    # Saved while it streams, marked as interrupted until it ends.
    qtbot.waitUntil(lambda: bool(window.store.conversations() and _assistant_rows(window)))
    [first] = _assistant_rows(window)
    assert first.finish_reason == "error" and first.content.startswith("t0 ")
    qtbot.waitUntil(lambda: len(_assistant_rows(window)[0].content) > len(first.content))
    [grown] = _assistant_rows(window)
    assert grown.id == first.id and grown.content.startswith(first.content)
    assert grown.segments and "".join(t for _, t in grown.segments) == grown.content
    # Away and back: the reply shows once, still streaming below the prompt.
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    window.chats.conversation_list.setCurrentIndex(window.chats.conversations.index(0, 0))
    assert window.transcript.toPlainText().count("t0 t1 t2") == 1
    with qtbot.waitSignal(window.service.generation_finished, timeout=5_000) as blocker:
        qtbot.mouseClick(window.composer.stop_button, Qt.MouseButton.LeftButton)
    [reply] = _assistant_rows(window)  # the same row, finished
    assert reply.id == first.id
    streamed = blocker.args[0].finished.token_ids
    assert (reply.content, reply.finish_reason) == (
        "".join(f"t{i} " for i in streamed),
        "cancelled",
    )
    assert reply.stats is not None and reply.origins
    assert "Stopped." in window.transcript.toPlainText()
    assert window.transcript.toPlainText().count("t0 t1 t2") == 1


def test_a_regenerated_reply_saved_as_it_grows_is_a_new_branch(
    qtbot: QtBot, make_window, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.services.chat_controller as chat_controller

    window = make_window(EngineWorker(load=_fake_load, stream=_scripted(3)))
    _load(qtbot, window, "/models/fake")
    _send(qtbot, window, "Hello")
    [old] = _assistant_rows(window)
    monkeypatch.setattr(chat_controller, "REPLY_SAVE_INTERVAL", 0.0)  # every batch
    seen: list[list] = []  # the replies in the database after each batch was handled
    window.service.tokens_generated.connect(lambda _b: seen.append(_assistant_rows(window)))
    with qtbot.waitSignal(window.service.generation_finished, timeout=5_000):
        window.transcript.regenerate_requested.emit(old.id)
    assert seen and all(len(rows) == 2 and rows[0] == old for rows in seen)
    streaming = seen[-1][1]
    assert streaming.parent_id == old.parent_id and streaming.finish_reason == "error"
    first, second = _assistant_rows(window)
    assert first == old and second.id == streaming.id
    assert second.parent_id == old.parent_id and second.finish_reason == "length"
    assert window.store.siblings(second.id) == [old.id, second.id]
    assert "2/2" in window.transcript.toPlainText()


def test_closing_mid_reply_saves_the_reply_so_far(qtbot: QtBot, make_window) -> None:
    window = make_window(EngineWorker(load=_fake_load, stream=_scripted(100_000, delay=0.002)))
    _load(qtbot, window, "/models/fake")
    window.composer.editor.setPlainText("Tell me everything")
    with qtbot.waitSignal(window.service.tokens_generated, timeout=5_000):
        qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(window.service.generation_finished, timeout=5_000):
        window.close()  # before the first timed save; it stops the reply
        # Saved at once: the app may quit before the stopped reply comes back.
        [partial] = _assistant_rows(window)
        # Quitting stops the reply: it is not an error.
        assert partial.content.startswith("t0 ") and partial.finish_reason == "cancelled"
    [reply] = _assistant_rows(window)
    assert reply.id == partial.id and reply.finish_reason == "cancelled"


def test_out_of_memory_unloads_the_pair_the_window_stays_up_and_loads_again(
    qtbot: QtBot, make_window
) -> None:
    from tests.fakes import _Engine

    engine = _Engine(MemoryError())
    window = make_window(EngineWorker(load=engine.load, stream=engine.stream))
    _load(qtbot, window, "/models/fake")
    window.composer.editor.setPlainText("Hello")
    with qtbot.waitSignal(window.service.failed, timeout=5_000):
        qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
    assert window.isVisible() and window.error_banner.isVisible()
    assert "the models were unloaded to free memory" in window.error_banner.text()
    assert window.status.pair.text() == "No model loaded"
    assert window.composer.send_button.isEnabled()
    [partial] = _assistant_rows(window)
    assert (partial.content, partial.finish_reason) == ("t0 t1 ", "error")
    # Sending now asks for a model rather than failing in the engine.
    window.composer.editor.setPlainText("Again")
    qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
    assert "Load a target model first" in window.error_banner.text()
    # The model bar still names the pair: Load brings it back and chat goes on.
    with qtbot.waitSignal(window.service.pair_loaded, timeout=5_000):
        qtbot.mouseClick(window.model_bar.load_button, Qt.MouseButton.LeftButton)
    assert window.status.pair.text() == "fake"
    _send(qtbot, window, "Again")
    assert _assistant_rows(window)[-1].finish_reason == "stop"


def test_stats_popover_never_makes_up_a_remote_acceptance() -> None:
    from app.ui.stats_popover import stats_rows

    silent = Stats(tokens=10, generation_seconds=1.0, stats_scope="not reported")
    wide = Stats(tokens=10, drafted=8, accepted=6, draft_rounds=2, stats_scope="server")
    assert dict(stats_rows(silent, "http://h:1#kind=mlx-lm", None))["Acceptance"] == (
        "not reported by the server"
    )
    assert dict(stats_rows(wide, "http://h:1", None))["Acceptance"] == (
        "75% (6 of 8) across the server"
    )


def test_a_remote_pair_shows_acceptance_as_not_reported(qtbot: QtBot, make_window) -> None:
    from app.services import PairInfo

    window = make_window()
    window.service.pair_loaded.emit(
        PairInfo("http://127.0.0.1:9#kind=mlx-lm", None, "remote: m @ 127.0.0.1:9")
    )
    assert window.panel.gauge.summary() == "Acceptance not reported"
    assert not window.panel.tune_button.isEnabled()
    window.service.pair_loaded.emit(PairInfo("/m/target", "/m/draft", "target + draft"))
    assert window.panel.gauge.summary().startswith("No drafting yet")
    assert window.panel.tune_button.isEnabled()


def _refused(_pair, _messages, _params, _cancel, control=None, decoder=None):  # type: ignore[no-untyped-def]
    from app.errors import ModelError

    raise ModelError("The conversation is longer than the window.")
    yield  # a generator, like the real stream


def test_another_callers_failed_reply_stays_out_of_the_banner(qtbot: QtBot, make_window) -> None:
    from app.engine.types import GenerationParams, Message

    window = make_window(EngineWorker(load=_fake_load, stream=_refused))
    _load(qtbot, window, "/models/fake")
    with qtbot.waitSignal(window.service.failed, timeout=5_000) as blocker:
        window.service.generate([Message("user", "Hi")], GenerationParams())  # as the server does
    assert blocker.args[0].stage == "generate"
    assert not window.error_banner.isVisible()
    assert not window.store.conversations()
    window.composer.editor.setPlainText("Hi")
    with qtbot.waitSignal(window.service.failed, timeout=5_000):
        qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
    assert window.error_banner.isVisible()  # the window's own failure is shown
    assert "longer than the window" in window.error_banner.text()


def test_stop_in_the_window_leaves_another_callers_reply(qtbot: QtBot, make_window) -> None:
    from app.engine.types import GenerationParams, Message

    window = make_window(EngineWorker(load=_fake_load, stream=_scripted(200, delay=0.002)))
    _load(qtbot, window, "/models/fake")
    with qtbot.waitSignal(window.service.tokens_generated, timeout=5_000):
        window.service.generate([Message("user", "Hi")], GenerationParams())
    with qtbot.waitSignal(window.service.generation_finished, timeout=10_000) as blocker:
        window.composer.stop_requested.emit()  # Esc
    assert blocker.args[0].finished.finish_reason == "length"
    assert len(blocker.args[0].finished.token_ids) == 200


# A reply of three rounds of 4 tokens (3 of 4 drafted kept), 0.5 s each: 8.0 tok/s live.
# The engine's final count adds a last round cut at the end of text (0.3 s more of
# decoding) and counts 6 s from start to end, most of it not decoding.
FINAL = Stats(
    prompt_tokens=57,
    tokens=12,
    drafted=12,
    accepted=9,
    target_calls=4,
    draft_rounds=3,
    num_draft=4,
    k_min=4,
    k_max=4,
    draft_seconds=0.3,
    verify_seconds=1.5,
    generation_seconds=6.0,
    baseline_tps=4.0,
)


class _TimedReply:
    """Plays :data:`FINAL`'s rounds; ``gates`` hold the next reply before each round and its end."""

    def __init__(self) -> None:
        import threading

        self.gates: list[threading.Event] = []

    def load(self, target: str, _draft, progress=None, loaded=None):  # type: ignore[no-untyped-def]
        from app.engine import LoadedModel, ModelPair

        config = {"max_position_embeddings": 32_768}
        return ModelPair(LoadedModel(Path(target), model=None, tokenizer=None, config=config))  # type: ignore[arg-type]  # no weights

    def stream(self, _pair, _messages, _params, cancel, control=None, decoder=None):  # type: ignore[no-untyped-def]
        from app.engine.types import Chunk, Finished, FinishReason, RoundStat

        gates, self.gates = self.gates, []
        origins = (Origin.DRAFT,) * 3 + (Origin.CORRECTION,)
        reason: FinishReason = "stop"
        for i in range(3):
            if gates:
                gates.pop(0).wait(10)
            if cancel.is_set():
                reason = "cancelled"
                break
            rnd = RoundStat(tokens=4, k=4, accepted=3, seconds=0.5)
            yield Chunk(f"r{i} ", (1, 2, 3, 4), origins, ("r", f"{i}", " ", ""), rnd, 4.0, 57)
        for gate in gates:
            gate.wait(10)
        yield Finished(FINAL, reason, (), ())


@pytest.mark.parametrize("stop", [False, True], ids=["finished", "stopped"])
def test_one_speed_for_a_reply_everywhere_and_final_replaces_live(
    qtbot: QtBot, make_window, stop: bool, timed_short_replies: None
) -> None:
    import threading

    from PySide6.QtCore import QUrl

    from app.ui.stats_popover import StatsPopover

    engine = _TimedReply()
    window = make_window(EngineWorker(load=engine.load, stream=engine.stream, flush_interval=0.0))
    _load(qtbot, window, "/m/target", "/m/draft")
    if stop:  # Stop after the first round: the engine still counts its own figures
        gate = threading.Event()
        engine.gates = [threading.Event(), gate]
        engine.gates[0].set()
        window.composer.editor.setPlainText("Hello")
        try:
            with qtbot.waitSignal(window.service.generation_finished, timeout=10_000):
                qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
                qtbot.waitUntil(lambda: "8.0 tok/s" in window.panel.gauge.summary())
                qtbot.mouseClick(window.composer.stop_button, Qt.MouseButton.LeftButton)
                gate.set()
        finally:  # a failed check leaves no engine thread waiting
            gate.set()
    else:
        _send(qtbot, window, "Hello")
    # 12 tokens over 1.8 s of decoding, against 4.0 tok/s plain: in the panel, the
    # status bar and Stats… alike, not the live 8.0 tok/s nor the 2.0 tok/s of 6 s.
    assert "6.7 tok/s, 1.67× plain" in window.panel.gauge.summary()
    assert window.panel.gauge.summary().startswith("Acceptance 75% this reply")
    assert window.status.speed.text() == "6.7 tok/s (1.67× plain)"
    assert window.status.acceptance.text() == "75% accepted (9/12), k 4"
    [conversation] = window.store.conversations()
    reply = window.store.messages(conversation.id)[1]
    assert reply.finish_reason == ("cancelled" if stop else "stop")
    window.transcript.anchorClicked.emit(QUrl(f"stats:{reply.id}"))
    [popover] = window.findChildren(StatsPopover)
    rows = dict(popover.rows)
    assert (rows["Speed"], rows["Speed-up"]) == ("6.7 tok/s", "1.67× plain")
    popover.close()


def test_the_status_bar_shows_the_reply_in_flight_not_the_last_one(
    qtbot: QtBot, make_window, timed_short_replies: None
) -> None:
    import threading

    engine = _TimedReply()
    window = make_window(EngineWorker(load=engine.load, stream=engine.stream, flush_interval=0.0))
    _load(qtbot, window, "/m/target", "/m/draft")
    _send(qtbot, window, "alpha")
    assert window.status.speed.text() == "6.7 tok/s (1.67× plain)"
    assert window.status.context.text() == "Context 69 / 32,768"
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.status.context.text() == "Context 0 / 32,768"  # an empty chat
    gates = [threading.Event() for _ in range(4)]
    engine.gates = list(gates)
    window.composer.editor.setPlainText("beta")
    try:
        with qtbot.waitSignal(window.service.generation_finished, timeout=10_000):
            qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
            # Before the first round: nothing of the last reply, the prompt not counted yet.
            assert window.status.speed.text() == "… tok/s"
            assert window.status.acceptance.text() != "75% accepted (9/12), k 4"
            assert window.status.context.text() == "Context … / 32,768"
            gates[0].set()
            qtbot.waitUntil(lambda: window.status.context.text() == "Context 61 / 32,768")
            assert window.status.speed.text() == "8.0 tok/s (2.00× plain)"  # this reply's, live
            assert window.status.acceptance.text() == "75% accepted (3/4), k 4"
            for gate in gates[1:]:
                gate.set()
    finally:  # a failed check leaves no engine thread waiting
        for gate in gates:
            gate.set()
    assert window.status.speed.text() == "6.7 tok/s (1.67× plain)"
    assert window.status.context.text() == "Context 69 / 32,768"


def test_stop_shows_stopping_at_once_until_the_reply_ends(qtbot: QtBot, make_window) -> None:
    from tests.fakes import _slow_to_stop

    window = make_window(EngineWorker(load=_fake_load, stream=_slow_to_stop()))
    _load(qtbot, window, "/models/fake")
    window.composer.editor.setPlainText("Tell me everything")
    with qtbot.waitSignal(window.service.tokens_generated, timeout=5_000):
        qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
    qtbot.keyClick(window.composer.editor, Qt.Key.Key_Escape)
    # The engine ends the reply a round later; the window says Stop was heard now.
    assert window.chat.busy
    assert window.composer.stop_button.text() == "Stopping…"
    assert not window.composer.stop_button.isEnabled()
    assert window.status.currentMessage() == "Stopping…"
    with qtbot.waitSignal(window.chat.ended, timeout=5_000):
        pass
    assert window.composer.stop_button.text() == "Stop"
    assert not window.composer.stop_button.isEnabled() and window.composer.send_button.isEnabled()
    assert window.status.currentMessage() == ""
    assert "Stopped." in window.transcript.toPlainText()


def test_the_empty_reply_says_how_far_the_prompt_is_read(qtbot: QtBot, make_window) -> None:
    import threading

    from tests.fakes import _reads_then_replies

    gate = threading.Event()
    window = make_window(EngineWorker(load=_fake_load, stream=_reads_then_replies(1, gate)))
    _load(qtbot, window, "/models/target")
    window.composer.editor.setPlainText("Summarise this long text.")
    qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
    note = "Tandem\nReading 1,204 tokens… 0 %"
    qtbot.waitUntil(lambda: window.transcript.toPlainText().endswith(note), timeout=5_000)
    # Shown again when the chat is opened again while the prompt is still read.
    cid = window.store.conversations()[0].id
    window.chats.new_requested.emit()
    window.chats.select(cid)
    assert window.transcript.toPlainText().endswith(note)
    with qtbot.waitSignal(window.service.generation_finished, timeout=5_000):
        gate.set()
    assert "Tandem\nHi\nCopy" in window.transcript.toPlainText()  # the reply in its place
    assert "Reading" not in window.transcript.toPlainText()


def test_a_reply_cut_by_the_token_limit_says_so(qtbot: QtBot, make_window) -> None:
    window = make_window(EngineWorker(load=_fake_load, stream=_scripted(3)))
    _load(qtbot, window, "/models/fake")
    _send(qtbot, window, "Hello")  # the script ends at its length, as max_tokens would
    qtbot.waitUntil(lambda: "limit" in window.transcript.toPlainText(), timeout=2_000)
    assert "Stopped at the 3-token limit.  Copy" in window.transcript.toPlainText()


def test_settings_has_a_shortcut_and_help_writes_keys_as_the_platform_does(
    qtbot: QtBot, make_window, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtGui import QAction, QKeySequence

    window = make_window()
    actions = {a.text(): a for a in window.findChildren(QAction)}
    native = QKeySequence(QKeySequence.StandardKey.Preferences)
    expected = native if not native.isEmpty() else QKeySequence("Ctrl+,")
    assert actions["Settings…"].shortcut() == expected and not expected.isEmpty()
    shown: list[str] = []
    # The class app.ui.menus shows its help through.
    monkeypatch.setattr(QMessageBox, "information", lambda _p, _t, text: shown.append(text))
    actions["Tandem &Help"].trigger()
    new = QKeySequence(QKeySequence.StandardKey.New).toString(
        QKeySequence.SequenceFormat.NativeText
    )
    assert f"<tr><td>{new}</td><td>New chat</td></tr>" in shown[0]
    settings = expected.toString(QKeySequence.SequenceFormat.NativeText)
    assert f"<tr><td>{settings}</td><td>Settings</td></tr>" in shown[0]
    if not new.startswith("⌘"):  # not a Mac: no Mac symbols anywhere the user reads
        chats = window.chats.conversation_list.empty_hint()
        texts = [shown[0], window.composer.editor.placeholderText(), chats]
        assert not any(sym in t for t in texts for sym in "⌘⇧⌥"), texts
        assert "Ctrl+Return to send" in window.composer.editor.placeholderText()
