"""Screenshots of the window in light and dark mode, for reviewers to look at.

They are written to ``build/screenshots/`` (ignored by git).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtGui import QColor, QImage, QPalette
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.engine.observe import BatchStats
from app.services import EngineLoad, EngineService, EngineWorker
from app.store import Settings, SettingsFile, Store
from app.ui.main_window import MainWindow
from tests.conftest import TinyModels
from tests.fakes import _fake_load, _load, _send

REPLY = (
    "Here is a function that adds two numbers:\n\n"
    '```python\ndef add(a: int, b: int) -> int:\n    """Adds a and b."""\n'
    "    return a + b\n```\n\n"
    "It **returns** the sum; for example `add(2, 3)` is 5.\n\n"
    "- works for ints\n- and for floats\n"
)


def _markdown_reply(drafter: str = "draft"):  # type: ignore[no-untyped-def]
    """A reply with code, in rounds of drafted (by a draft model, or the target's own
    ``"mtp"`` head), corrected and bonus tokens."""
    import re

    from app.engine.types import Chunk, Finished, Origin, RoundStat, Stats

    drafted = Origin.MTP if drafter == "mtp" else Origin.DRAFT

    words = re.findall(r"\s*\S+|\s+", REPLY)

    def stream(_pair, _messages, _params, _cancel, control=None, decoder=None):  # type: ignore[no-untyped-def]
        i = 0
        while i < len(words):
            k, accepted = 4, (3 if i % 3 else 4)
            pieces = tuple(words[i : i + accepted + 1])
            orig = [drafted] * (len(pieces) - 1)
            orig.append(Origin.BONUS if accepted == k else Origin.CORRECTION)
            rnd = RoundStat(len(pieces), k, accepted, seconds=0.02)
            yield Chunk("".join(pieces), tuple(range(len(pieces))), tuple(orig), pieces, rnd, 40.0)
            i += len(pieces)
        stats = Stats(
            tokens=len(words),
            drafted=40,
            accepted=33,
            target_calls=10,
            draft_rounds=10,
            num_draft=4,
            k_min=4,
            k_max=4,
            generation_seconds=0.2,
            baseline_tps=40.0,
        )
        yield Finished(stats, "stop", (), ())

    return stream


OUT = Path(__file__).parents[2] / "build" / "screenshots"


def dark_palette() -> QPalette:
    p = QPalette()
    for role, colour in (
        (QPalette.ColorRole.Window, "#1e1e1e"),
        (QPalette.ColorRole.WindowText, "#e6e6e6"),
        (QPalette.ColorRole.Base, "#151515"),
        (QPalette.ColorRole.AlternateBase, "#262626"),
        (QPalette.ColorRole.Text, "#e6e6e6"),
        (QPalette.ColorRole.Button, "#2d2d2d"),
        (QPalette.ColorRole.ButtonText, "#e6e6e6"),
        (QPalette.ColorRole.Highlight, "#0a84ff"),
        (QPalette.ColorRole.HighlightedText, "#ffffff"),
        (QPalette.ColorRole.PlaceholderText, "#8e8e93"),
        (QPalette.ColorRole.Mid, "#3a3a3a"),
        (QPalette.ColorRole.Link, "#4da3ff"),
    ):
        p.setColor(role, QColor(colour))
    return p


def _colours(image: QImage) -> int:
    step = max(image.width() // 64, 1)
    return len(
        {
            image.pixel(x, y)
            for x in range(0, image.width(), step)
            for y in range(0, image.height(), step)
        }
    )


def test_window_screenshots_in_light_and_dark(
    qtbot: QtBot, tmp_path: Path, tiny: TinyModels
) -> None:
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    OUT.mkdir(parents=True, exist_ok=True)
    light = app.palette()
    shots: dict[str, QImage] = {}
    try:
        for mode, palette in (("light", light), ("dark", dark_palette())):
            app.setPalette(palette)
            store = Store(tmp_path / f"{mode}.sqlite3")
            service = EngineService(EngineWorker(load=_fake_load, stream=_markdown_reply()))
            models = tmp_path / f"models-{mode}"
            models.mkdir()
            window = MainWindow(
                store, service, SettingsFile(tmp_path / f"{mode}.json"), models_dir=models
            )
            qtbot.addWidget(window)
            window.resize(1280, 760)
            window.show()
            _load(
                qtbot,
                window,
                "/models/Qwen2.5-7B-Instruct-4bit",
                "/models/Qwen2.5-0.5B-Instruct-4bit",
            )
            _send(qtbot, window, "Write a Python function that adds two numbers.")
            assert "def add(a: int, b: int) -> int:" in window.transcript.toPlainText()
            qtbot.wait(50)  # let the status bar lay out its new texts
            image = window.grab().toImage()
            image.save(str(OUT / f"main-{mode}.png"))
            shots[mode] = image
            window.close()
            assert service.shutdown()
            store.close()
    finally:
        app.setPalette(light)
    for mode, image in shots.items():
        assert (OUT / f"main-{mode}.png").stat().st_size > 10_000
        assert _colours(image) > 8, mode  # a real window, not a blank frame

    # Dark mode really is darker.
    def mean_lightness(image: QImage) -> float:
        pixels = [
            QColor(image.pixel(x, y)).lightnessF()
            for x in range(0, image.width(), 16)
            for y in range(0, image.height(), 16)
        ]
        return sum(pixels) / len(pixels)

    assert mean_lightness(shots["dark"]) < mean_lightness(shots["light"]) - 0.3


def test_window_screenshot_drafting_with_the_targets_own_head(
    qtbot: QtBot, tmp_path: Path, tiny: TinyModels
) -> None:
    from app.ui.gauge import HEAD_SOURCE

    OUT.mkdir(parents=True, exist_ok=True)
    store = Store(tmp_path / "mtp.sqlite3")
    service = EngineService(EngineWorker(load=_fake_load, stream=_markdown_reply("mtp")))
    (tmp_path / "models").mkdir()
    window = MainWindow(
        store, service, SettingsFile(tmp_path / "mtp.json"), models_dir=tmp_path / "models"
    )
    qtbot.addWidget(window)
    window.resize(1280, 760)
    window.show()
    _load(qtbot, window, "/models/Qwen3.6-27B-4bit", "mtp")
    _send(qtbot, window, "Write a Python function that adds two numbers.")
    qtbot.wait(50)
    image = window.grab().toImage()
    image.save(str(OUT / "main-mtp.png"))
    window.close()
    assert service.shutdown()
    store.close()
    # The gauge names the drafter: the target's own head, in its tokens' colour.
    assert window.live.snapshot().own_head
    pixels = {
        image.pixel(x, y) & 0xFFFFFF
        for x in range(image.width() * 3 // 4, image.width())
        for y in range(image.height() // 2)
    }
    assert HEAD_SOURCE.rgb() & 0xFFFFFF in pixels


def test_tune_dialog_screenshot_with_a_cuda_like_curve(qtbot: QtBot) -> None:
    from app.ui.tune_dialog import TuneDialog
    from tests.fakes import BUILTIN, PROFILED

    OUT.mkdir(parents=True, exist_ok=True)
    dialog = TuneDialog(PROFILED.pair, [], BUILTIN)
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.show_last_result(PROFILED)
    qtbot.wait(50)  # let the charts lay out their series and legends
    image = dialog.grab().toImage()
    path = OUT / "tune_curve.png"
    assert image.save(str(path))
    assert path.stat().st_size > 10_000
    assert _colours(image) > 8  # a real dialog, not a blank frame
    assert dialog.charts.cost_series.count() == 17 and dialog.charts.pick_series.isVisible()


@contextlib.contextmanager
def _palette(mode: str) -> Iterator[QApplication]:
    """The app in ``mode`` ("light" or "dark") for a screenshot, light again after it."""
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    OUT.mkdir(parents=True, exist_ok=True)
    light = app.palette()
    try:
        if mode == "dark":
            app.setPalette(dark_palette())
        yield app
    finally:
        app.setPalette(light)


def _grab(widget, name: str) -> QImage:  # type: ignore[no-untyped-def]
    """Shows ``widget``, lets it lay out, saves it as ``name``.png and returns the image."""
    widget.show()
    QApplication.processEvents()
    image = widget.grab().toImage()
    path = OUT / f"{name}.png"
    assert image.save(str(path))
    assert path.stat().st_size > 2_000
    assert _colours(image) > 4, name  # a real view, not a blank frame
    return image


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_reply_figures_screenshots(qtbot: QtBot, mode: str) -> None:
    """The gauge of a reply that kept 1 of 8 drafted tokens, and the status bar mid-reply."""
    from app.engine.live import LiveStats
    from app.engine.types import RoundStat, Stats
    from app.store import Settings
    from app.ui.speculation_panel import SpeculationPanel
    from app.ui.statusbar import StatusBar

    with _palette(mode):
        live = LiveStats()
        live.set_lifetime(accepted=610, drafted=800)
        live.add([RoundStat(tokens=8, k=8, accepted=7, seconds=0.2)] * 31, baseline_tps=20.0)
        live.begin_message()
        live.add([RoundStat(tokens=2, k=8, accepted=1, seconds=0.15)])
        status = StatusBar()
        qtbot.addWidget(status)
        status.resize(760, 30)
        status.context.show_usage(None, 32_768)
        status.show_live(live.snapshot())
        _grab(status, f"statusbar-live-{mode}")
        assert status.speed.text() == "13.3 tok/s (speedup: too short to measure)"
        live.finish_message(
            Stats(tokens=2, drafted=8, accepted=1, draft_seconds=0.05, verify_seconds=0.1)
        )
        panel = SpeculationPanel(Settings())
        qtbot.addWidget(panel)
        panel.resize(280, 640)
        panel.show_snapshot(live.snapshot())
        _grab(panel, f"gauge-{mode}")
        assert panel.gauge.summary().startswith("Acceptance 12% this reply (recent")


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_tune_and_welcome_screenshots(qtbot: QtBot, mode: str) -> None:
    """Tune… mid-run and after a cancel; the welcome card while the real pair loads."""
    from app.hub.catalog import load_catalog, recommend
    from app.ui.onboarding import OnboardingView
    from app.ui.tune_dialog import TuneDialog
    from tests.fakes import BUILTIN

    with _palette(mode):
        dialog = TuneDialog("Qwen2.5-7B + Qwen2.5-0.5B", [], BUILTIN)
        qtbot.addWidget(dialog)
        dialog.resize(900, 560)
        dialog.run_button.click()
        _grab(dialog, f"tune-running-{mode}")
        assert dialog.summary.text().startswith("Sweeping")
        dialog.cancel_button.click()
        dialog.show_cancelled()
        _grab(dialog, f"tune-cancelled-{mode}")
        assert dialog.run_button.isEnabled() and "Cancelling" not in dialog.status.text()
        gb = 1000**3
        view = OnboardingView(recommend(load_catalog(), 24 * gb), 24 * gb)
        qtbot.addWidget(view)
        view.resize(900, 460)
        view.show_message("Cannot load /models/missing: no such folder.")
        view.show_loading(1 / 3, "Loading the target")
        _grab(view, f"welcome-loading-{mode}")
        assert view.progress_label.text() == "Loading the target…"


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_issue_16_views_screenshots(
    qtbot: QtBot, tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopping…, the bar at 800 px, Settings without a key store, the server panel,
    the Remote Engine dialog and a search hit opened on its branch."""
    import app.ui.settings_dialog as settings_dialog
    from app.server.http import RequestLog
    from app.ui.composer import Composer
    from app.ui.remote_dialog import RemoteEngineDialog
    from app.ui.server_panel import ServerPanel
    from app.ui.settings_dialog import SettingsDialog
    from tests.ui.chats import branched

    monkeypatch.setattr(settings_dialog, "key_storage_status", lambda: "no system keychain")
    with _palette(mode):
        composer = Composer()
        qtbot.addWidget(composer)
        composer.resize(640, 90)
        composer.set_busy(True)
        composer.show_stopping()
        _grab(composer, f"composer-stopping-{mode}")
        dialog = SettingsDialog(
            Settings(target="http://127.0.0.1:9#kind=openai-compatible"), tmp_path
        )
        qtbot.addWidget(dialog)
        _grab(dialog, f"settings-no-keychain-{mode}")
        panel = ServerPanel()
        qtbot.addWidget(panel)
        panel.set_server("http://127.0.0.1:8642/v1", None)
        panel.add_request(RequestLog("GET", "/v1/models", 200, 0.004))
        panel.add_request(RequestLog("POST", "/v1/chat/completions", 200, 1.25, 42))
        _grab(panel, f"server-panel-{mode}")
        remote = RemoteEngineDialog()
        qtbot.addWidget(remote)
        _grab(remote, f"remote-engine-{mode}")
        store = Store(tmp_path / "chats.sqlite3")
        window = MainWindow(
            store, EngineService(), SettingsFile(tmp_path / "s.json"), models_dir=tmp_path
        )
        qtbot.addWidget(window)
        window.resize(800, 600)
        window.show()
        window.onboarding_flow.close()  # the chat, not the first-run view of an empty library
        window.model_bar.set_pair("http://127.0.0.1:9#kind=openai-compatible", "")
        cid, hit = branched(store)
        window.chats.select(cid)
        window.chats.search_edit.setText("zebra")
        qtbot.waitUntil(lambda: window.chats.conversations.hit_at(0) == hit, timeout=2_000)
        window.chats.conversation_list.setCurrentIndex(window.chats.conversations.index(0, 0))
        assert window.transcript.highlighted_message == hit
        _grab(window, f"search-hit-800px-{mode}")
        window.close()
        window.service.shutdown()
        store.close()


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_reading_the_prompt_screenshots(qtbot: QtBot, tmp_path: Path, mode: str) -> None:
    """The reply before its first token: how far the prompt is read, and what was reused."""
    import threading

    from tests.fakes import _reads_then_replies

    app = QApplication.instance()
    assert isinstance(app, QApplication)
    OUT.mkdir(parents=True, exist_ok=True)
    light = app.palette()
    gate = threading.Event()
    try:
        if mode == "dark":
            app.setPalette(dark_palette())
        store = Store(tmp_path / "tandem.sqlite3")
        stream = _reads_then_replies(1, gate, reused=512)
        service = EngineService(EngineWorker(load=_fake_load, stream=stream))
        window = MainWindow(store, service, SettingsFile(tmp_path / "s.json"), models_dir=tmp_path)
        qtbot.addWidget(window)
        window.resize(1280, 760)
        window.show()
        _load(
            qtbot, window, "/models/Qwen2.5-7B-Instruct-4bit", "/models/Qwen2.5-0.5B-Instruct-4bit"
        )
        window.composer.editor.setPlainText("Summarise the report I pasted above.")
        window.composer.send_button.click()
        note = "Reading 1,204 tokens… 42 % · 512 reused"
        qtbot.waitUntil(lambda: window.transcript.toPlainText().endswith(note), timeout=5_000)
        qtbot.wait(50)  # let the transcript lay out the note
        image = window.grab().toImage()
        assert image.save(str(OUT / f"reading-{mode}.png"))
        assert _colours(image) > 8  # a real window, not a blank frame
        with qtbot.waitSignal(service.generation_finished, timeout=5_000):
            gate.set()
        window.close()
        assert service.shutdown()
        store.close()
    finally:
        gate.set()
        app.setPalette(light)
    assert (OUT / f"reading-{mode}.png").stat().st_size > 10_000


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_empty_states_and_server_switch_screenshots(
    qtbot: QtBot, tmp_path: Path, mode: str
) -> None:
    """The empty chat list, a search with no hit, the empty Models table, the server
    panel's switch and a reply cut at the token limit."""
    from app.engine.types import Stats
    from app.store import StoredMessage
    from app.ui.model_manager import ModelManagerDialog
    from app.ui.server_panel import ServerPanel
    from app.ui.transcript import TranscriptView
    from tests.ui.conftest import FakeHub

    with _palette(mode):
        store = Store(tmp_path / "chats.sqlite3")
        window = MainWindow(
            store, EngineService(), SettingsFile(tmp_path / "s.json"), models_dir=tmp_path
        )
        qtbot.addWidget(window)
        window.resize(900, 560)
        window.show()
        window.onboarding_flow.close()  # the chat, not the first-run view of an empty library
        _grab(window, f"empty-chats-{mode}")
        assert window.chats.conversation_list.empty_hint().startswith("No conversations yet")
        store.create_conversation("Animals")
        window.chats.search_edit.setText("xyz")
        qtbot.waitUntil(lambda: "xyz" in window.chats.conversation_list.empty_hint(), timeout=2_000)
        _grab(window.chats, f"empty-search-{mode}")
        window.close()
        window.service.shutdown()
        store.close()
        models = tmp_path / "models"
        models.mkdir(exist_ok=True)
        dialog = ModelManagerDialog(models, hf_cache_dir=tmp_path / "hf", hub=FakeHub())  # type: ignore[arg-type]
        qtbot.addWidget(dialog)
        qtbot.waitUntil(lambda: not dialog.scanning, timeout=5_000)  # scanned off the GUI thread
        _grab(dialog, f"models-empty-{mode}")
        assert dialog.table.empty_hint().startswith("No models yet")
        panel = ServerPanel()
        qtbot.addWidget(panel)
        panel.show_problem("The local server did not start: [Errno 98] address already in use")
        _grab(panel, f"server-panel-stopped-{mode}")
        panel.set_server("http://127.0.0.1:8080/v1", None)
        shared = BatchStats(
            active=3, rounds=412, drafted=2400, accepted=1872, largest=4, shared=1536
        )
        panel.show_load(EngineLoad(active=3, waiting=1, batched=3, batch=shared))
        _grab(panel, f"server-panel-running-{mode}")
        assert panel.switch_button.text() == "Stop Server"
        view = TranscriptView()
        qtbot.addWidget(view)
        view.resize(640, 220)
        cut = Stats(tokens=1024)
        view.show_messages(
            [
                StoredMessage(1, 1, "user", "Tell me a very long story.", 0.0),
                StoredMessage(
                    2, 1, "assistant", "Once upon a time…", 0.0, finish_reason="length", stats=cut
                ),
            ]
        )
        _grab(view, f"token-limit-{mode}")
        assert "Stopped at the 1,024-token limit." in view.toPlainText()


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_library_prompt_screenshots(
    qtbot: QtBot, tmp_path: Path, tiny: TinyModels, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing loaded, models in the library: the last and the recommended pair, one click each."""
    import shutil

    from app.hub import fit

    monkeypatch.setattr(fit, "usable_memory_bytes", lambda total=None, **_: 16 * 1000**3)
    models = tmp_path / "models"
    for folder in (tiny.target, tiny.draft):
        shutil.copytree(folder, models / folder.name)
    settings = SettingsFile(tmp_path / "s.json")
    settings.save(Settings(target=str(models / "tiny-llama")))
    with _palette(mode):
        store = Store(tmp_path / "chats.sqlite3")
        window = MainWindow(store, EngineService(), settings, models_dir=models)
        qtbot.addWidget(window)
        window.resize(1000, 620)
        window.composer.editor.setPlainText("Hello")
        window.show()
        qtbot.waitUntil(window.library_prompt.isVisible, timeout=5_000)  # once scanned
        window.composer.send_button.click()
        assert window.library_prompt.isVisible() and window.error_banner.isVisible()
        _grab(window, f"library-prompt-{mode}")
        window.close()
        window.service.shutdown()
        store.close()


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_tune_estimate_and_quick_mode_screenshots(qtbot: QtBot, mode: str) -> None:
    """Tune… on a slow machine: the time estimate, quick mode, and progress within a run."""
    from app.engine.calibrate import CalibrationProgress
    from app.ui.tune_dialog import TuneDialog
    from tests.fakes import BUILTIN

    with _palette(mode):
        dialog = TuneDialog("Qwen2.5-7B + Qwen2.5-0.5B", [], BUILTIN, plain_tps=6.0)
        qtbot.addWidget(dialog)
        dialog.resize(900, 560)
        _grab(dialog, f"tune-estimate-{mode}")
        assert "at 6.0 tok/s plain decoding" in dialog.estimate.text()
        dialog.quick_check.setChecked(True)
        dialog.run_button.click()
        dialog.show_progress(CalibrationProgress(1, 3, "k = 4, prompt 1 of 1", 10, 24, 7.0))
        _grab(dialog, f"tune-quick-running-{mode}")
        assert "(10 of 24 tokens)" in dialog.status.text()


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_branch_arrows_screenshots(qtbot: QtBot, mode: str) -> None:
    """The branch switcher's arrows, large enough to hit, one of them hovered."""
    from PySide6.QtCore import QEvent, QPoint, Qt
    from PySide6.QtGui import QMouseEvent, QTextCursor

    from app.store import StoredMessage
    from app.ui.transcript import TranscriptView

    with _palette(mode):
        view = TranscriptView()
        qtbot.addWidget(view)
        view.resize(640, 220)
        view.show()
        messages = [
            StoredMessage(1, 1, "user", "What is speculative decoding?", 0.0),
            StoredMessage(2, 1, "assistant", "A small model drafts; the large one checks.", 0.0),
        ]
        view.show_messages(messages, {1: (2, 3), 2: (1, 2)})
        found = view.document().find("\u2002›\u2002")
        cursor = QTextCursor(view.document())
        cursor.setPosition(found.selectionStart() + 1)
        point: QPoint = view.cursorRect(cursor).center()
        move = QMouseEvent(
            QEvent.Type.MouseMove,
            point,
            view.viewport().mapToGlobal(point),
            Qt.MouseButton.NoButton,
            Qt.MouseButton.NoButton,
            Qt.KeyboardModifier.NoModifier,
        )
        QApplication.sendEvent(view.viewport(), move)
        assert view.hovered_branch is not None
        _grab(view, f"branch-arrows-{mode}")


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_edit_in_place_screenshots(qtbot: QtBot, mode: str) -> None:
    """A user message edited in place: long text wraps, the reply below moves down."""
    from app.store import StoredMessage
    from app.ui.transcript import TranscriptView

    with _palette(mode):
        view = TranscriptView()
        qtbot.addWidget(view)
        view.resize(640, 360)
        view.show()
        question = "What is speculative decoding?"
        answer_text = "A small model drafts; the large one checks."
        view.show_messages(
            [
                StoredMessage(1, 1, "user", question, 0.0),
                StoredMessage(2, 1, "assistant", answer_text, 0.0),
            ]
        )
        edit = (
            f"{question} Explain it to someone who knows what a language model is but "
            "has never heard of drafting, and say when it does not help."
        )
        assert view.begin_edit(1, edit)
        image = _grab(view, f"edit-in-place-{mode}")
        assert view.editor.field.horizontalScrollBar().maximum() == 0  # it wraps
        answer = view.cursorRect(view.document().find("A small model drafts")).top()
        assert view.editor.geometry().bottom() < answer  # the reply shows below the editor
        assert _colours(image) > 8


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_waiting_beside_the_server_screenshots(qtbot: QtBot, tmp_path: Path, mode: str) -> None:
    """The window's message sent while the server's replies fill the batch: it waits, visibly."""
    from app.engine.types import GenerationParams, Message
    from tests.fakes import _scripted

    with _palette(mode):
        store = Store(tmp_path / "chats.sqlite3")
        worker = EngineWorker(load=_fake_load, stream=_scripted(300, delay=0.01), max_batch=1)
        service = EngineService(worker)
        window = MainWindow(store, service, SettingsFile(tmp_path / "s.json"), models_dir=tmp_path)
        qtbot.addWidget(window)
        window.resize(1100, 720)
        window.show()
        _load(qtbot, window, "/models/Qwen2.5-7B-Instruct-4bit", "/models/Qwen2.5-0.5B-4bit")
        with qtbot.waitSignal(service.tokens_generated, timeout=5_000):
            service.generate([Message("user", "Hi")], GenerationParams(), shared=True)
        window.composer.editor.setPlainText("And a haiku about lighthouses, please.")
        with qtbot.waitSignal(window.chat.waiting, timeout=5_000):
            window.composer.send_button.click()
        _grab(window, f"waiting-for-the-server-{mode}")
        assert "Waiting for a place" in window.transcript.toPlainText()
        assert window.width() == 1100
        window.close()
        assert service.shutdown()
        QApplication.sendPostedEvents()  # the stopped replies' ends, saved before closing
        store.close()
