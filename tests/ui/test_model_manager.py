from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import QItemSelectionModel, Qt
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from app.hub import ModelInfo
from app.ui.model_manager import ModelManagerDialog
from tests.conftest import TinyModels


@pytest.fixture
def library(tiny: TinyModels, small_draft: Path, tmp_path: Path) -> Path:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copytree(tiny.target, models / "tiny-llama")
    shutil.copytree(tiny.foreign, models / "tiny-foreign")
    shutil.copytree(small_draft, models / "tiny-small")
    (models / "broken").mkdir()
    return models


def _scanned(qtbot: QtBot, dialog: ModelManagerDialog) -> ModelManagerDialog:
    """Waits for the library scan, which runs off the GUI thread, to fill the list."""
    qtbot.waitUntil(lambda: not dialog.scanning, timeout=10_000)
    return dialog


def _dialog(qtbot: QtBot, models: Path, tmp_path: Path) -> ModelManagerDialog:
    dialog = ModelManagerDialog(models, hf_cache_dir=tmp_path / "hf")
    qtbot.addWidget(dialog)
    dialog.show()
    return _scanned(qtbot, dialog)


def _info(dialog: ModelManagerDialog, row: int) -> ModelInfo:
    info = dialog.library.info_at(row)
    assert info is not None
    return info


def _select(dialog: ModelManagerDialog, name: str) -> None:
    row = next(r for r in range(dialog.library.rowCount()) if _info(dialog, r).name == name)
    dialog.table.selectionModel().select(
        dialog.library.index(row, 0),
        QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows,
    )


def test_lists_the_library_with_problems(qtbot: QtBot, library: Path, tmp_path: Path) -> None:
    dialog = _dialog(qtbot, library, tmp_path)
    names = [_info(dialog, r).name for r in range(dialog.library.rowCount())]
    assert names == ["broken", "tiny-foreign", "tiny-llama", "tiny-small"]
    broken = dialog.library.index(0, 1).data()
    assert broken.startswith("⚠") and "config.json" in broken
    assert dialog.library.index(2, 1).data() == "llama"
    _select(dialog, "broken")
    assert not dialog.target_button.isEnabled()  # a broken model cannot be used
    assert dialog.delete_button.isEnabled()


def test_choose_a_pair_and_see_the_verdict(qtbot: QtBot, library: Path, tmp_path: Path) -> None:
    dialog = _dialog(qtbot, library, tmp_path)
    _select(dialog, "tiny-llama")
    qtbot.mouseClick(dialog.target_button, Qt.MouseButton.LeftButton)
    _select(dialog, "tiny-foreign")
    qtbot.mouseClick(dialog.draft_button, Qt.MouseButton.LeftButton)
    # check-pair's sentence, as generate and the load refuse the pair.
    assert dialog.verdict_label.text().startswith(
        "✗ Incompatible: tiny-foreign cannot draft for tiny-llama: vocabulary sizes differ"
    )
    assert "token ids differ" in dialog.verdict_label.text()
    _select(dialog, "tiny-small")
    qtbot.mouseClick(dialog.draft_button, Qt.MouseButton.LeftButton)
    assert dialog.verdict_label.text() == "✓ Compatible pair"
    with qtbot.waitSignal(dialog.pair_chosen) as blocker:
        qtbot.mouseClick(dialog.load_button, Qt.MouseButton.LeftButton)
    assert blocker.args == [str(library / "tiny-llama"), str(library / "tiny-small")]


def test_delete_asks_and_says_what_it_frees(
    qtbot: QtBot, library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dialog = _dialog(qtbot, library, tmp_path)
    asked: list[str] = []

    def answer(button):  # type: ignore[no-untyped-def]
        def question(_parent, _title, text, *_rest):  # type: ignore[no-untyped-def]
            asked.append(text)
            return button

        return question

    _select(dialog, "tiny-foreign")
    monkeypatch.setattr(QMessageBox, "question", answer(QMessageBox.StandardButton.Cancel))
    qtbot.mouseClick(dialog.delete_button, Qt.MouseButton.LeftButton)
    assert (library / "tiny-foreign").exists()
    assert "frees" in asked[0] and "KB" in asked[0]
    monkeypatch.setattr(QMessageBox, "question", answer(QMessageBox.StandardButton.Yes))
    qtbot.mouseClick(dialog.delete_button, Qt.MouseButton.LeftButton)
    assert not (library / "tiny-foreign").exists()
    assert _scanned(qtbot, dialog).library.rowCount() == 3


def test_import_adds_the_model_to_the_list(
    qtbot: QtBot, library: Path, tmp_path: Path, tiny: TinyModels
) -> None:
    from app.services import HubService
    from tests.fakes import _gguf

    hub = HubService()
    try:
        dialog = ModelManagerDialog(library, hf_cache_dir=tmp_path / "hf", hub=hub)
        qtbot.addWidget(dialog)
        dialog.show()
        assert dialog.hub_panel.import_button.isEnabled()
        gguf = _gguf(tiny, tmp_path)
        with qtbot.waitSignal(hub.finished, timeout=30_000):
            dialog.hub_panel.start_task("import-gguf", str(gguf))
            assert (
                dialog.hub_panel.progress.isVisible() and dialog.hub_panel.cancel_button.isVisible()
            )
        assert not dialog.hub_panel.progress.isVisible()
        assert dialog.hub_panel.progress_label.text() == "Added tiny"
        _scanned(qtbot, dialog)
        names = [_info(dialog, r).name for r in range(dialog.library.rowCount())]
        assert "tiny" in names
    finally:
        assert hub.shutdown()


def test_failed_download_says_why(qtbot: QtBot, library: Path, tmp_path: Path) -> None:
    from app.services import HubService

    hub = HubService()
    try:
        dialog = ModelManagerDialog(library, hf_cache_dir=tmp_path / "hf", hub=hub)
        qtbot.addWidget(dialog)
        with qtbot.waitSignal(hub.failed, timeout=30_000):
            dialog.hub_panel.start_task("download", "mlx-community/Nope-4bit")
        assert "no network" in dialog.hub_panel.progress_label.text()
        assert dialog.hub_panel.import_button.isEnabled()
        dialog.hub_panel.search_edit.setText("mlx-community/Nope-4bit")
        assert dialog.hub_panel.download_button.isEnabled()  # free to try again
    finally:
        assert hub.shutdown()


def test_token_field_explains_a_missing_keychain(
    qtbot: QtBot, library: Path, tmp_path: Path
) -> None:
    import keyring
    from keyring.backends import fail

    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        dialog = _dialog(qtbot, library, tmp_path)
        assert not dialog.hub_panel.token_edit.isEnabled()
        assert dialog.hub_panel.token_edit.placeholderText().startswith(
            "Token storage is unavailable:"
        )
    finally:
        keyring.set_keyring(previous)


def test_verdict_says_when_a_pair_does_not_fit(
    qtbot: QtBot, library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.hub import fit

    monkeypatch.setattr(fit, "usable_memory_bytes", lambda total=None, **_: 1_000)
    dialog = _dialog(qtbot, library, tmp_path)
    _select(dialog, "tiny-llama")
    qtbot.mouseClick(dialog.target_button, Qt.MouseButton.LeftButton)
    _select(dialog, "tiny-small")
    qtbot.mouseClick(dialog.draft_button, Qt.MouseButton.LeftButton)
    assert dialog.verdict_label.text().startswith("✗ Does not fit in memory: needs ")
    # The bar shows it in red, and the pair cannot be loaded.
    assert dialog.memory_bar.isVisible()
    assert dialog.memory_bar.summary().startswith("Needs ")
    assert "(does not fit)" in dialog.memory_bar.summary()
    assert {c.name() for _, c in dialog.memory_bar.segments()} == {"#dc2626"}
    assert not dialog.load_button.isEnabled()


def test_memory_bar_draws_a_fitting_pair_to_scale(
    qtbot: QtBot, library: Path, tmp_path: Path
) -> None:
    dialog = _dialog(qtbot, library, tmp_path)
    assert not dialog.memory_bar.isVisible()  # nothing chosen yet
    _select(dialog, "tiny-llama")
    qtbot.mouseClick(dialog.target_button, Qt.MouseButton.LeftButton)
    assert dialog.memory_bar.isVisible()
    assert dialog.verdict_label.text() == "No draft: plain decoding."
    fit = dialog.memory_bar.fit
    assert fit is not None and fit.fits
    fractions = [f for f, _ in dialog.memory_bar.segments()]
    assert abs(sum(fractions) - fit.needed_bytes / fit.available_bytes) < 1e-9
    assert dialog.memory_bar.grab().width() > 0  # paints without error
    assert dialog.load_button.isEnabled()


def test_draft_list_offers_only_compatible_drafts(
    qtbot: QtBot, library: Path, tmp_path: Path
) -> None:
    dialog = _dialog(qtbot, library, tmp_path)
    assert dialog.draft_list.count() == 0
    assert "choose a target first" in dialog.drafts_label.text()
    _select(dialog, "tiny-llama")
    qtbot.mouseClick(dialog.target_button, Qt.MouseButton.LeftButton)
    items = [dialog.draft_list.item(i).text() for i in range(dialog.draft_list.count())]
    assert len(items) == 1 and items[0].startswith("tiny-small")  # not tiny-foreign
    dialog.draft_list.setCurrentRow(0)
    assert dialog.use_draft_button.text() == "Use Draft"
    qtbot.mouseClick(dialog.use_draft_button, Qt.MouseButton.LeftButton)
    assert dialog.draft == str(library / "tiny-small")
    assert dialog.verdict_label.text() == "✓ Compatible pair"


def test_draft_list_offers_the_catalog_draft_of_a_downloaded_target(
    qtbot: QtBot, library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(library / "tiny-llama", library / "mlx-community--Qwen3-8B-4bit")
    started: list[tuple[str, str]] = []
    dialog = _dialog(qtbot, library, tmp_path)
    dialog.hub_panel.hub = object()  # type: ignore[assignment]  # only needs to be present
    monkeypatch.setattr(
        dialog.hub_panel, "start_task", lambda kind, source: started.append((kind, source))
    )
    _select(dialog, "mlx-community--Qwen3-8B-4bit")
    qtbot.mouseClick(dialog.target_button, Qt.MouseButton.LeftButton)
    rows = [dialog.draft_list.item(i) for i in range(dialog.draft_list.count())]
    offered = [r for r in rows if "recommended, not downloaded" in r.text()]
    assert [r.text().split()[0] for r in offered] == ["mlx-community/Qwen3-0.6B-4bit"]
    assert "Apache-2.0" in offered[0].toolTip()
    dialog.draft_list.setCurrentItem(offered[0])
    assert dialog.use_draft_button.text() == "Download Draft"
    qtbot.mouseClick(dialog.use_draft_button, Qt.MouseButton.LeftButton)
    assert started == [("download", "mlx-community/Qwen3-0.6B-4bit")]


def _hub_dialog(qtbot: QtBot, library: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    from tests.ui.conftest import FakeHub

    hub = FakeHub()
    dialog = ModelManagerDialog(library, hf_cache_dir=tmp_path / "hf", hub=hub)  # type: ignore[arg-type]
    qtbot.addWidget(dialog)
    dialog.show()
    return _scanned(qtbot, dialog), hub


def test_imports_are_stored_as_the_panel_says(
    qtbot: QtBot, library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtWidgets import QFileDialog

    from app.services import HubResult

    dialog, hub = _hub_dialog(qtbot, library, tmp_path)
    panel = dialog.hub_panel
    # MLX computes on this CPU, where float32 is faster than 4-bit.
    assert panel.import_as.currentText() == "full precision"
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: (["/x/m.gguf"], ""))
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: "/x/m")
    qtbot.mouseClick(panel.import_button, Qt.MouseButton.LeftButton)
    assert not panel.import_as.isEnabled()  # one task at a time, stored as it began
    hub.finished.emit(HubResult(1, str(library / "tiny-llama")))
    panel.import_as.setCurrentIndex(panel.import_as.findText("4-bit"))
    qtbot.mouseClick(panel.import_folder_button, Qt.MouseButton.LeftButton)
    assert hub.started == [("import-gguf", "/x/m.gguf", None), ("import-folder", "/x/m", None)]
    assert hub.bits == [None, 4]
    assert hub.heads == [None, None]
    monkeypatch.setattr("app.ui.hub_downloads.mlx_runs_on_gpu", lambda: True)
    on_a_gpu, _ = _hub_dialog(qtbot, library, tmp_path)
    assert on_a_gpu.hub_panel.import_as.currentText() == "4-bit"


def test_a_gguf_import_takes_its_mtp_heads_file_along(
    qtbot: QtBot, library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtWidgets import QFileDialog

    dialog, hub = _hub_dialog(qtbot, library, tmp_path)
    panel = dialog.hub_panel
    chosen = ["/x/mtp-m.gguf", "/x/m.gguf", "/x/other.gguf"]
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: (chosen, ""))
    qtbot.mouseClick(panel.import_button, Qt.MouseButton.LeftButton)
    assert hub.started == []
    assert panel.progress_label.text() == (
        "Choose one GGUF file, or a model's file with its MTP head's file."
    )
    del chosen[2]
    qtbot.mouseClick(panel.import_button, Qt.MouseButton.LeftButton)
    # In either order: the hub tells the head's file from the model's.
    assert hub.started == [("import-gguf", "/x/mtp-m.gguf", None)]
    assert hub.heads == ["/x/m.gguf"]


def test_search_lists_repos_and_downloads_the_chosen_one(
    qtbot: QtBot, library: Path, tmp_path: Path
) -> None:
    from app.hub.downloads import RepoInfo
    from app.services import HubSearchResult

    dialog, hub = _hub_dialog(qtbot, library, tmp_path)
    assert (
        not dialog.hub_panel.download_button.isEnabled()
        and not dialog.hub_panel.results.isVisible()
    )
    dialog.hub_panel.search_edit.setText("qwen 0.5b")
    qtbot.mouseClick(dialog.hub_panel.search_button, Qt.MouseButton.LeftButton)
    assert hub.started == [("search", "qwen 0.5b", None)]
    assert dialog.hub_panel.progress_label.text() == "Searching for “qwen 0.5b”…"
    repos = (
        RepoInfo("mlx-community/Qwen2.5-0.5B-Instruct-4bit", 1_234_567, 10, False, ()),
        RepoInfo("mlx-community/Llama-3.2-1B-Instruct-4bit", 900, 3, True, ()),
    )
    hub.searched.emit(HubSearchResult(99, "stale", ()))  # another search's answer
    assert not dialog.hub_panel.results.isVisible()
    hub.searched.emit(HubSearchResult(1, "qwen 0.5b", repos))
    assert dialog.hub_panel.results.isVisible() and dialog.hub_panel.results.count() == 2
    assert dialog.hub_panel.progress_label.text() == "2 models found"
    assert dialog.hub_panel.results.item(0).text().endswith("1.2 M downloads")
    assert "license must be accepted" in dialog.hub_panel.results.item(1).text()
    dialog.hub_panel.results.setCurrentRow(0)
    assert dialog.hub_panel.download_button.isEnabled()
    qtbot.mouseClick(dialog.hub_panel.download_button, Qt.MouseButton.LeftButton)
    assert hub.started[-1] == ("download", "mlx-community/Qwen2.5-0.5B-Instruct-4bit", None)
    assert not dialog.hub_panel.download_button.isEnabled()  # one download at a time


def test_a_typed_repo_id_downloads_without_a_search(
    qtbot: QtBot, library: Path, tmp_path: Path
) -> None:
    dialog, hub = _hub_dialog(qtbot, library, tmp_path)
    dialog.hub_panel.search_edit.setText("some-org/Some.Model-4bit")
    assert dialog.hub_panel.download_button.isEnabled()
    dialog.hub_panel.search_edit.setText("not a repo id")
    assert not dialog.hub_panel.download_button.isEnabled()
    dialog.hub_panel.search_edit.setText("some-org/Some.Model-4bit")
    qtbot.keyClick(dialog.hub_panel.search_edit, Qt.Key.Key_Return)
    assert hub.started == [("download", "some-org/Some.Model-4bit", None)]


def test_a_failed_search_says_why(qtbot: QtBot, library: Path, tmp_path: Path) -> None:
    from app.services import HubFailure

    dialog, hub = _hub_dialog(qtbot, library, tmp_path)
    dialog.hub_panel.search_edit.setText("llama")
    dialog.hub_panel.search_button.click()
    hub.failed.emit(HubFailure(1, "No network: the Hugging Face Hub cannot be reached."))
    assert dialog.hub_panel.progress_label.text().startswith("No network")
    assert not dialog.hub_panel.progress.isVisible()


def test_download_shows_the_file_and_the_total(qtbot: QtBot, library: Path, tmp_path: Path) -> None:
    from app.services import HubProgress

    dialog, hub = _hub_dialog(qtbot, library, tmp_path)
    dialog.hub_panel.start_task("download", "org/m")
    assert dialog.hub_panel.progress.isVisible() and not dialog.hub_panel.file_progress.isVisible()
    gb = 1000**3
    hub.progressed.emit(
        HubProgress(1, "model.safetensors", 3 * gb, 4 * gb, "model.safetensors", gb, 2 * gb)
    )
    assert dialog.hub_panel.file_progress.isVisible()
    assert dialog.hub_panel.file_progress.value() == 500
    assert dialog.hub_panel.file_progress.format() == "model.safetensors %p%"
    assert dialog.hub_panel.progress.value() == 750
    assert dialog.hub_panel.progress.format() == "3.0 GB of 4.0 GB"
    assert dialog.hub_panel.progress_label.text() == "Downloading model.safetensors"


def test_remote_engine_is_chosen_as_a_url_target(
    qtbot: QtBot, library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.keychain as secrets

    saved: dict[str, str] = {}
    monkeypatch.setattr(secrets, "keyring_status", lambda: None)
    monkeypatch.setattr(secrets, "set_remote_key", lambda url, key: saved.update({url: key}))
    dialog = ModelManagerDialog(library, tmp_path / "hf")
    qtbot.addWidget(dialog)
    remote = dialog.remote_dialog()
    remote.url_edit.setText("not a url")
    remote.use_button.click()
    assert "not an http(s) server address" in remote.error_label.text()

    remote.url_edit.setText("http://studio.local:8080/v1")
    remote.kind_combo.setCurrentText("vllm")
    remote.model_edit.setText("qwen")
    remote.key_edit.setText("sk-1")
    with qtbot.waitSignal(dialog.pair_chosen) as blocker:
        remote.use_button.click()
    assert blocker.args == ["http://studio.local:8080#kind=vllm&model=qwen", ""]
    assert saved == {"http://studio.local:8080": "sk-1"}


def test_remote_key_field_says_why_without_a_keychain(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.keychain as secrets
    from app.ui.remote_dialog import RemoteEngineDialog

    monkeypatch.setattr(
        secrets, "keyring_status", lambda: "token storage is unavailable: no system keychain"
    )
    dialog = RemoteEngineDialog()
    qtbot.addWidget(dialog)
    assert not dialog.key_edit.isEnabled()
    assert dialog.key_note.text() == "key storage is unavailable: no system keychain"


def test_the_memory_bar_counts_the_loaded_pair_and_a_model_kept_once(
    qtbot: QtBot, library: Path, tmp_path: Path
) -> None:
    def size(name: str) -> int:
        return sum(f.stat().st_size for f in (library / name).glob("*.safetensors"))

    loaded = (str(library / "tiny-llama"), str(library / "tiny-small"))
    dialog = ModelManagerDialog(library, hf_cache_dir=tmp_path / "hf", loaded=loaded)
    qtbot.addWidget(dialog)
    dialog.show()
    _select(_scanned(qtbot, dialog), "tiny-llama")
    qtbot.mouseClick(dialog.target_button, Qt.MouseButton.LeftButton)
    fit = dialog.memory_bar.fit
    assert fit is not None
    # The loaded pair stays in memory while this one loads; the target it keeps counts once.
    assert fit.held_bytes == size("tiny-llama") + size("tiny-small")
    assert fit.reused_bytes == size("tiny-llama")
    assert "loaded already" in dialog.memory_bar.summary()


def test_the_remote_engine_dialog_shows_its_placeholders_whole(qtbot: QtBot) -> None:
    from app.ui.fit import text_room
    from app.ui.remote_dialog import RemoteEngineDialog

    dialog = RemoteEngineDialog()
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    for edit in (dialog.url_edit, dialog.model_edit, dialog.draft_edit, dialog.key_edit):
        advance = edit.fontMetrics().horizontalAdvance(edit.placeholderText())
        assert advance <= text_room(edit), edit.placeholderText()


def test_an_empty_library_says_how_to_fill_it(qtbot: QtBot, library: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    dialog, _hub = _hub_dialog(qtbot, empty, tmp_path)
    assert dialog.library.rowCount() == 0
    assert dialog.table.empty_hint() == (
        "No models yet: search the Hub below and Download, or Import GGUF…"
    )
    offline = _dialog(qtbot, empty, tmp_path)  # no Hub: Download is off
    assert offline.table.empty_hint().startswith("No models yet: put MLX model folders")
    assert _dialog(qtbot, library, tmp_path).table.empty_hint() == ""


def test_a_float32_model_shows_its_dtype_and_counts_read_alike(
    qtbot: QtBot, library: Path, tmp_path: Path
) -> None:
    from dataclasses import replace

    from app.hub import human_count

    dialog = _dialog(qtbot, library, tmp_path)
    columns = dialog.library.COLUMNS
    row = next(r for r in range(dialog.library.rowCount()) if _info(dialog, r).name == "tiny-llama")
    info = _info(dialog, row)
    assert info.quantization is None  # the tiny models are plain float32
    assert dialog.library.index(row, columns.index("Quantization")).data() == "float32"
    # A 0.63 B model reads as the Hub's download counts and the pair check's sizes do.
    dialog.library.set_models([replace(info, parameters=630_200_000)])
    assert dialog.library.index(0, columns.index("Parameters")).data() == "630.2 M"
    assert human_count(630_200_000) == "630.2 M" and human_count(7_615_616_512) == "7.6 B"


def test_a_target_with_an_mtp_head_lists_it_first_among_its_drafts(
    qtbot: QtBot, library: Path, tiny: TinyModels, tmp_path: Path
) -> None:
    from tests.engine.families import mtp_model

    mtp_model(library / "qwen3.5-tiny", tiny.target)
    dialog = _dialog(qtbot, library, tmp_path)
    _select(dialog, "qwen3.5-tiny")
    qtbot.mouseClick(dialog.target_button, Qt.MouseButton.LeftButton)
    first = dialog.draft_list.item(0)
    assert first is not None and first.text().startswith("Built-in (MTP)")
    dialog.draft_list.setCurrentRow(0)
    qtbot.mouseClick(dialog.use_draft_button, Qt.MouseButton.LeftButton)
    assert dialog.draft == "mtp"
    assert "Draft: Built-in (MTP)" in dialog.pair_label.text()
    assert dialog.verdict_label.text() == "✓ Compatible pair"
    assert dialog.load_button.isEnabled()
