"""First run: an empty library shows the pair for this machine, downloads it and loads it."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.hub import catalog, fit
from app.hub.catalog import RECOMMEND_SHARE, load_catalog
from app.services import EngineService, HubFailure, HubProgress, HubResult
from app.store import SettingsFile, Store
from app.ui.main_window import MainWindow
from app.ui.onboarding import OnboardingView
from tests.conftest import TinyModels
from tests.ui.conftest import FakeHub

GB = 1000**3
# What the view calls the machine: "this Mac" said on Linux was wrong.
MACHINE = "this Mac" if sys.platform == "darwin" else "this computer"


@pytest.fixture
def window(qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MainWindow]:
    monkeypatch.setattr(fit, "usable_memory_bytes", lambda total=None, **_: 16 * GB)
    # The Hub's 4-bit pairs are for MLX on a GPU; on the CPU the demo pair is offered.
    monkeypatch.setattr(catalog, "mlx_runs_on_gpu", lambda: True)
    (tmp_path / "models").mkdir()
    store = Store(tmp_path / "tandem.sqlite3")
    service = EngineService()
    w = MainWindow(
        store, service, SettingsFile(tmp_path / "settings.json"), models_dir=tmp_path / "models"
    )
    qtbot.addWidget(w)
    w.show()
    yield w
    w.close()
    assert service.shutdown()
    store.close()


def test_an_empty_library_gets_the_largest_pair_that_fits(window: MainWindow) -> None:
    view = window.onboarding
    assert view is not None and window.pages.currentWidget() is view
    # With room to spare: the 13.5 GB pair fits in 16 GB, but with too little to spare.
    fitting = [p for p in load_catalog() if p.memory_gb <= 16 * RECOMMEND_SHARE]
    assert any(p.memory_gb <= 16 and p not in fitting for p in load_catalog())
    expected = max(fitting, key=lambda p: p.memory_gb)
    assert view.pair == expected
    assert view.pair_title.text() == f"Recommended for {MACHINE}: {expected.name}"
    detail = view.pair_detail.text()
    assert expected.target in detail and expected.draft in detail
    assert f"{expected.download_gb:g} GB to download" in detail
    assert "of the 16.0 GB models can use here" in detail
    assert "License: " in detail
    assert view.download_button.isVisible() and not view.progress.isVisible()


def test_a_mac_too_small_for_every_pair_is_told_so(qtbot: QtBot) -> None:
    view = OnboardingView(None, 2 * GB)
    qtbot.addWidget(view)
    view.show()
    assert view.pair_title.text() == f"No recommended pair fits {MACHINE}"
    assert "2.0 GB" in view.pair_detail.text()
    assert not view.download_button.isVisible()
    assert view.import_button.isEnabled() and view.models_button.isEnabled()


def test_download_both_then_load_the_pair(
    qtbot: QtBot, window: MainWindow, tiny: TinyModels, small_draft: Path, tmp_path: Path
) -> None:
    hub = FakeHub()
    window.set_hub(hub)  # type: ignore[arg-type]
    view = window.onboarding
    assert view is not None and view.pair is not None
    qtbot.mouseClick(view.download_button, Qt.MouseButton.LeftButton)
    assert [(k, s) for k, s, _ in hub.started] == [
        ("download", view.pair.target),
        ("download", view.pair.draft),
    ]
    assert view.progress.isVisible() and not view.download_button.isEnabled()

    hub.progressed.emit(HubProgress(1, "model.safetensors 2.0 of 4.0 GB", 2, 4))
    assert view.progress.value() == 250  # half of the first of two
    assert view.progress_label.text() == "1 of 2: model.safetensors 2.0 of 4.0 GB"
    hub.progressed.emit(HubProgress(2, "model.safetensors 1 of 2 GB", 1, 2))
    assert view.progress.value() == 750

    target, draft = tmp_path / "models" / "t", tmp_path / "models" / "d"
    shutil.copytree(tiny.target, target)
    shutil.copytree(small_draft, draft)
    hub.finished.emit(HubResult(1, str(target)))
    assert window.onboarding is view  # still waiting for the draft
    with qtbot.waitSignal(window.service.pair_loaded, timeout=20_000):
        hub.finished.emit(HubResult(2, str(draft)))
    assert window.onboarding is None and window.pages.currentIndex() == 0
    assert window.model_bar.target() == str(target)
    assert window.model_bar.draft() == str(draft)
    assert window.status.pair.text() == "t + d"


def test_a_failed_download_cancels_the_other_and_says_why(window: MainWindow) -> None:
    hub = FakeHub()
    window.set_hub(hub)  # type: ignore[arg-type]
    view = window.onboarding
    assert view is not None
    view.download_button.click()
    hub.failed.emit(HubFailure(1, "No network: the Hugging Face Hub cannot be reached."))
    assert hub.cancelled == [2]
    assert view.progress_label.text().startswith("No network")
    assert view.download_button.isEnabled() and not view.progress.isVisible()
    view.cancel_button.click()  # nothing left to cancel
    assert hub.cancelled == [2]


def test_cancel_stops_both_downloads(window: MainWindow) -> None:
    hub = FakeHub()
    window.set_hub(hub)  # type: ignore[arg-type]
    view = window.onboarding
    assert view is not None
    view.download_button.click()
    view.cancel_button.click()
    assert hub.cancelled == [1, 2]


def test_an_import_becomes_the_target(
    qtbot: QtBot, window: MainWindow, tiny: TinyModels, tmp_path: Path, monkeypatch
) -> None:
    from PySide6.QtWidgets import QFileDialog

    hub = FakeHub()
    window.set_hub(hub)  # type: ignore[arg-type]
    view = window.onboarding
    assert view is not None
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: (["/x/m.gguf"], ""))
    # Where MLX computes on a GPU, an import is stored in 4 bits; on this CPU as it is.
    monkeypatch.setattr("app.hub.catalog.mlx_runs_on_gpu", lambda: True)
    view.import_button.click()
    assert hub.started == [("import-gguf", "/x/m.gguf", None)]
    assert hub.bits == [4]
    imported = tmp_path / "models" / "m"
    shutil.copytree(tiny.target, imported)
    with qtbot.waitSignal(window.service.pair_loaded, timeout=20_000):
        hub.finished.emit(HubResult(1, str(imported)))
    assert window.model_bar.target() == str(imported)
    assert window.model_bar.draft() == ""


def test_a_library_with_models_skips_the_first_run_view(
    qtbot: QtBot, tmp_path: Path, tiny: TinyModels
) -> None:
    shutil.copytree(tiny.target, tmp_path / "models" / "tiny")
    store = Store(tmp_path / "tandem.sqlite3")
    service = EngineService()
    try:
        w = MainWindow(
            store, service, SettingsFile(tmp_path / "s.json"), models_dir=tmp_path / "models"
        )
        qtbot.addWidget(w)
        # The library is scanned off the GUI thread; once it lands, the view goes.
        qtbot.waitUntil(lambda: w.onboarding is None and w.pages.count() == 1, timeout=10_000)
    finally:
        assert service.shutdown()
        store.close()


def test_loading_a_pair_replaces_an_earlier_failure_on_the_card(
    qtbot: QtBot, window: MainWindow, tiny: TinyModels, tmp_path: Path
) -> None:
    view = window.onboarding
    assert view is not None
    window.model_bar.target_edit.setText(str(tmp_path / "missing"))
    with qtbot.waitSignal(window.service.failed, timeout=20_000):
        qtbot.mouseClick(window.model_bar.load_button, Qt.MouseButton.LeftButton)
    error = view.progress_label.text()
    assert error and not view.progress.isVisible()
    # The real pair loads (from Models… or the model bar): the card follows it.
    seen: list[tuple[str, bool]] = []
    window.service.load_progressed.connect(
        lambda _p: seen.append((view.progress_label.text(), view.progress.isVisible()))
    )
    window.model_bar.target_edit.setText(str(tiny.target))
    with qtbot.waitSignal(window.service.pair_loaded, timeout=20_000):
        qtbot.mouseClick(window.model_bar.load_button, Qt.MouseButton.LeftButton)
    assert seen, "no load progress"
    for text, busy in seen:
        assert text != error and text.endswith("…") and busy, seen
    assert window.onboarding is None  # and once loaded, the chat takes its place


def test_the_cards_bar_moves_with_the_bytes_read(window: MainWindow) -> None:
    from app.services import LoadProgress

    view = window.onboarding
    assert view is not None
    # Step 1 of 2 (the target), a quarter of its bytes read: an eighth of the load.
    gb = 1 << 30
    window.service.load_progressed.emit(LoadProgress(0, 2, "Loading t", gb, 4 * gb))
    assert view.progress.value() == 125
    window.service.load_progressed.emit(LoadProgress(0, 2, "Loading t", 3 * gb, 4 * gb))
    assert view.progress.value() == 375


def _library_window(make_window, monkeypatch, tmp_path: Path, tiny: TinyModels, last: tuple):  # type: ignore[no-untyped-def]
    from app.services import EngineWorker
    from app.store import Settings
    from tests.fakes import _fake_load, _scripted

    monkeypatch.setattr(fit, "usable_memory_bytes", lambda total=None, **_: 16 * GB)
    models = tmp_path / "models"
    target, draft = (str(models / p.name) if p else "" for p in last)
    SettingsFile(tmp_path / "settings.json").save(Settings(target=target, draft=draft))
    worker = EngineWorker(load=_fake_load, stream=_scripted(1))
    return make_window(worker, library=(tiny.target, tiny.draft))


def test_a_library_with_nothing_loaded_offers_the_last_and_the_recommended_pair(
    qtbot: QtBot, make_window, monkeypatch, tmp_path: Path, tiny: TinyModels
) -> None:
    window = _library_window(make_window, monkeypatch, tmp_path, tiny, (tiny.target, None))
    prompt = window.library_prompt
    qtbot.waitUntil(prompt.isVisible, timeout=10_000)  # once the library scan lands
    assert window.onboarding is None and prompt.isVisible()
    assert "Your library has 2 models" in prompt.detail.text()
    assert prompt.last_button.text() == "Load Last Pair: tiny-llama"
    # The largest model, with the library's model that can draft for it.
    assert prompt.recommended_button.text() == "Load Recommended: tiny-llama + tiny-qwen2"
    with qtbot.waitSignal(window.service.pair_loaded, timeout=5_000):
        qtbot.mouseClick(prompt.recommended_button, Qt.MouseButton.LeftButton)
    models = tmp_path / "models"
    assert window.model_bar.target() == str(models / "tiny-llama")
    assert window.model_bar.draft() == str(models / "tiny-qwen2")
    assert not prompt.isVisible()


def test_the_last_pair_loads_with_one_click_and_is_not_offered_twice(
    qtbot: QtBot, make_window, monkeypatch, tmp_path: Path, tiny: TinyModels
) -> None:
    window = _library_window(make_window, monkeypatch, tmp_path, tiny, (tiny.target, tiny.draft))
    prompt = window.library_prompt
    qtbot.waitUntil(prompt.isVisible, timeout=10_000)  # once the library scan lands
    assert prompt.last_button.isVisible() and not prompt.recommended_button.isVisible()
    with qtbot.waitSignal(window.service.pair_loaded, timeout=5_000):
        qtbot.mouseClick(prompt.last_button, Qt.MouseButton.LeftButton)
    assert window.status.pair.text() == "tiny-llama"  # the fake loads no draft
    assert not prompt.isVisible()


def test_the_load_first_banner_clears_once_a_pair_loads(
    qtbot: QtBot, make_window, tiny: TinyModels
) -> None:
    import threading

    from app.services import EngineWorker
    from tests.fakes import _fake_load, _scripted

    gate = threading.Event()

    def slow_load(target, draft, progress=None, loaded=None):  # type: ignore[no-untyped-def]
        gate.wait(5)
        return _fake_load(target, draft)

    window = make_window(EngineWorker(load=slow_load, stream=_scripted(1)), library=(tiny.target,))
    window.model_bar.target_edit.setText(str(tiny.target))
    qtbot.mouseClick(window.model_bar.load_button, Qt.MouseButton.LeftButton)
    window.composer.editor.setPlainText("Hello")  # sent while the pair still loads
    qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)
    assert "Load a target model first" in window.error_banner.text()
    with qtbot.waitSignal(window.service.pair_loaded, timeout=5_000):
        gate.set()
    assert not window.error_banner.isVisible()
    assert not window.library_prompt.isVisible()
