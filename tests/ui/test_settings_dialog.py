"""Settings: the default pair and sampling, the data folder, clearing all data."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox, QMessageBox
from pytestqt.qtbot import QtBot

from app.store import Settings
from app.ui.settings_dialog import SettingsDialog


def _dialog(qtbot: QtBot, tmp_path: Path, settings: Settings | None = None) -> SettingsDialog:
    dialog = SettingsDialog(settings or Settings(), tmp_path)
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog


def _click_ok(dialog: SettingsDialog) -> None:
    """Clicks the dialog's OK button."""
    box = dialog.findChild(QDialogButtonBox)
    assert box is not None
    box.button(QDialogButtonBox.StandardButton.Ok).click()


def test_edits_come_back_as_settings(qtbot: QtBot, tmp_path: Path) -> None:
    dialog = _dialog(qtbot, tmp_path, Settings(temperature=0.3, best_k={"a|b": 3}))
    assert dialog.temperature.value() == pytest.approx(0.3)
    dialog.target_edit.setText("/models/t")
    dialog.top_p.setValue(0.9)
    dialog.top_k.setValue(40)
    dialog.min_p.setValue(0.05)
    dialog.repetition_penalty.setValue(1.1)
    dialog.max_tokens.setValue(2048)
    dialog.seed.setText("7")
    with qtbot.waitSignal(dialog.settings_changed) as blocker:
        _click_ok(dialog)
    s: Settings = blocker.args[0]
    assert (s.target, s.draft, s.top_p, s.top_k, s.max_tokens, s.seed) == (
        "/models/t",
        None,
        pytest.approx(0.9),
        40,
        2048,
        7,
    )
    assert s.min_p == pytest.approx(0.05) and s.repetition_penalty == pytest.approx(1.1)
    assert s.best_k == {"a|b": 3}  # what the dialog does not show is kept


def test_a_bad_seed_is_explained_and_nothing_is_saved(qtbot: QtBot, tmp_path: Path) -> None:
    dialog = _dialog(qtbot, tmp_path)
    dialog.seed.setText("seven")
    emitted: list[object] = []
    dialog.settings_changed.connect(emitted.append)
    _click_ok(dialog)
    assert emitted == [] and dialog.isVisible()
    assert dialog.error_label.text().startswith("The seed must be a whole number")


def test_clear_all_data_asks_first(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dialog = _dialog(qtbot, tmp_path)
    asked: list[str] = []
    cleared: list[bool] = []
    dialog.clear_data_requested.connect(lambda: cleared.append(True))

    def answer(button: QMessageBox.StandardButton) -> Callable[..., QMessageBox.StandardButton]:
        def warning(_p: object, _t: str, text: str, *_a: object) -> QMessageBox.StandardButton:
            asked.append(text)
            return button

        return warning

    monkeypatch.setattr(QMessageBox, "warning", answer(QMessageBox.StandardButton.Cancel))
    qtbot.mouseClick(dialog.clear_button, Qt.MouseButton.LeftButton)
    assert cleared == [] and "cannot be undone" in asked[0]
    monkeypatch.setattr(QMessageBox, "warning", answer(QMessageBox.StandardButton.Reset))
    qtbot.mouseClick(dialog.clear_button, Qt.MouseButton.LeftButton)
    assert cleared == [True]


def test_reveal_opens_the_data_folder(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtGui import QDesktopServices

    opened: list[str] = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url.toLocalFile()))
    dialog = _dialog(qtbot, tmp_path)
    qtbot.mouseClick(dialog.reveal_button, Qt.MouseButton.LeftButton)
    assert opened == [str(tmp_path)]


def test_the_missing_key_store_note_is_tall_enough_for_every_line(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.ui.settings_dialog as settings_dialog

    reason = "API key storage is unavailable: no system keychain was found"
    monkeypatch.setattr(settings_dialog, "key_storage_status", lambda: reason)
    # A short data folder: the dialog opens as narrow as its other rows let it.
    dialog = _dialog(qtbot, Path("/tmp/tandem"))
    qtbot.waitExposed(dialog)
    note = dialog.key_note
    assert reason in note.text()
    # Wrapped to its width, the note gets the height of all its lines, descenders included.
    needed = note.heightForWidth(note.contentsRect().width())
    assert needed // note.fontMetrics().lineSpacing() >= 3
    assert note.contentsRect().height() >= needed


def test_a_remote_default_target_shows_as_its_url_and_is_kept_whole(
    qtbot: QtBot, tmp_path: Path
) -> None:
    target = "http://127.0.0.1:9#kind=openai-compatible"
    dialog = _dialog(qtbot, tmp_path, Settings(target=target))
    assert dialog.target_edit.text() == "http://127.0.0.1:9"
    assert dialog.edited().target == target
    dialog.target_edit.setText("/models/other")
    assert dialog.edited().target == "/models/other"
