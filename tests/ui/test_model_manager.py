from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import QItemSelectionModel, Qt
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

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


def _dialog(qtbot: QtBot, models: Path, tmp_path: Path) -> ModelManagerDialog:
    dialog = ModelManagerDialog(models, hf_cache_dir=tmp_path / "hf")
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog


def _select(dialog: ModelManagerDialog, name: str) -> None:
    row = next(
        r for r in range(dialog.library.rowCount()) if dialog.library.info_at(r).name == name
    )
    dialog.table.selectionModel().select(
        dialog.library.index(row, 0),
        QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows,
    )


def test_lists_the_library_with_problems(qtbot: QtBot, library: Path, tmp_path: Path) -> None:
    dialog = _dialog(qtbot, library, tmp_path)
    names = [dialog.library.info_at(r).name for r in range(dialog.library.rowCount())]
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
    assert dialog.verdict_label.text().startswith("✗ Incompatible")
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
    assert dialog.library.rowCount() == 3


def test_import_adds_the_model_to_the_list(
    qtbot: QtBot, library: Path, tmp_path: Path, tiny: TinyModels
) -> None:
    from app.services import HubService
    from tests.services.test_hub_service import _gguf

    hub = HubService()
    try:
        dialog = ModelManagerDialog(library, hf_cache_dir=tmp_path / "hf", hub=hub)
        qtbot.addWidget(dialog)
        dialog.show()
        assert dialog.import_button.isEnabled()
        gguf = _gguf(tiny, tmp_path)
        with qtbot.waitSignal(hub.finished, timeout=30_000):
            dialog.start_task("import-gguf", str(gguf))
            assert dialog.progress.isVisible() and dialog.cancel_button.isVisible()
        assert not dialog.progress.isVisible()
        assert dialog.progress_label.text() == "Added tiny"
        names = [dialog.library.info_at(r).name for r in range(dialog.library.rowCount())]
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
            dialog.start_task("download", "mlx-community/Nope-4bit")
        assert "no network" in dialog.progress_label.text()
        assert dialog.download_button.isEnabled()
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
        assert not dialog.token_edit.isEnabled()
        assert dialog.token_edit.placeholderText().startswith("Token storage unavailable:")
    finally:
        keyring.set_keyring(previous)


def test_verdict_says_when_a_pair_does_not_fit(
    qtbot: QtBot, library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.hub import fit

    monkeypatch.setattr(fit, "usable_memory_bytes", lambda total=None: 1_000)
    dialog = _dialog(qtbot, library, tmp_path)
    _select(dialog, "tiny-llama")
    qtbot.mouseClick(dialog.target_button, Qt.MouseButton.LeftButton)
    _select(dialog, "tiny-small")
    qtbot.mouseClick(dialog.draft_button, Qt.MouseButton.LeftButton)
    assert dialog.verdict_label.text().startswith("✗ Does not fit in memory: needs ")
