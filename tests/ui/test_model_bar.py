"""The model bar: a remote engine shows as its URL; at 800 px no field is cut short."""

from __future__ import annotations

import pytest
from pytestqt.qtbot import QtBot

from app.services import EngineWorker
from app.store import Settings
from app.ui.fit import text_room
from app.ui.model_bar import ModelBar
from tests.fakes import _fake_load

UNREACHABLE = "http://127.0.0.1:9#kind=openai-compatible"  # port 9 refuses at once


def test_a_remote_engine_shows_as_its_url_and_loads_whole(qtbot: QtBot) -> None:
    bar = ModelBar(Settings(target=UNREACHABLE))
    qtbot.addWidget(bar)
    assert bar.target_edit.text() == "http://127.0.0.1:9"
    assert "#" not in bar.target_edit.toolTip()
    with qtbot.waitSignal(bar.load_requested) as blocker:
        bar.request_load()
    assert blocker.args == [UNREACHABLE, ""]  # the kind stays behind the field
    bar.target_edit.setText("http://other:8080")  # typed over: what was typed is the target
    assert bar.target() == "http://other:8080"


def test_an_unreachable_remote_engine_leaves_no_encoding_in_any_field(
    qtbot: QtBot, make_window
) -> None:
    window = make_window(EngineWorker(load=_fake_load))
    with qtbot.waitSignal(window.service.failed, timeout=10_000):
        window.library_prompt.load_requested.emit(UNREACHABLE, "")  # Load Last Pair
    assert window.model_bar.target_edit.text() == "http://127.0.0.1:9"
    assert "#" not in window.status.pair.text()
    assert "kind=" not in window.error_banner.text()
    assert window.model_bar.target() == UNREACHABLE  # Load tries the same engine again


@pytest.mark.parametrize("width", [800, 1100])
def test_the_pair_fields_show_their_whole_placeholders(
    qtbot: QtBot, make_window, width: int
) -> None:
    window = make_window()
    window.model_bar.set_presets(["Balanced", "Precise", "Creative", "Code"])
    window.resize(width, 720)
    qtbot.waitUntil(lambda: window.width() == width)
    bar = window.model_bar
    qtbot.waitUntil(lambda: bar.width() <= width)
    for edit in (bar.target_edit, bar.draft_edit):
        advance = edit.fontMetrics().horizontalAdvance(edit.placeholderText())
        assert advance <= text_room(edit), (width, edit.placeholderText())
    assert bar.is_one_row() == (width >= bar.one_row_width())
    assert bar.temp_spin.geometry().right() <= bar.width()


def test_a_load_under_way_says_so_and_takes_no_second_request(qtbot: QtBot) -> None:
    bar = ModelBar(Settings(target="/models/target"))
    qtbot.addWidget(bar)
    bar.set_loading(True)
    assert bar.is_loading()
    with qtbot.assertNotEmitted(bar.load_requested):
        bar.request_load()
    bar.set_loading(False)
    assert not bar.is_loading()
    with qtbot.waitSignal(bar.load_requested):
        bar.request_load()


def test_the_fields_show_models_by_name_and_pick_them_from_the_library(
    qtbot: QtBot, tmp_path
) -> None:
    folder = tmp_path / "models" / "Qwen2.5-Coder-1.5B-Instruct"
    cached = tmp_path / "hub" / "models--mlx-community--Qwen2.5-0.5B-4bit" / "snapshots" / "ab12"
    bar = ModelBar(Settings(target=str(folder)))
    qtbot.addWidget(bar)
    # The name, not a cut-off path; the path is in the tooltip and is what loads.
    assert bar.target_edit.text() == "Qwen2.5-Coder-1.5B-Instruct"
    assert bar.target_edit.toolTip() == str(folder) and bar.target() == str(folder)
    bar.set_library(lambda: [("Qwen2.5-Coder-1.5B-Instruct", folder), ("small", cached)])
    menu = bar.draft_picker.menu()
    menu.aboutToShow.emit()
    names = [a.text() for a in menu.actions() if not a.isSeparator()]
    assert names == ["Qwen2.5-Coder-1.5B-Instruct", "small", "No Draft", "Choose Folder…"]
    menu.actions()[1].trigger()
    assert bar.draft() == str(cached)
    assert bar.draft_edit.text() == "mlx-community/Qwen2.5-0.5B-4bit"  # a Hub cache's repo id
    with qtbot.waitSignal(bar.load_requested) as blocker:
        bar.request_load()
    assert blocker.args == [str(folder), str(cached)]


def test_a_target_with_an_mtp_head_offers_it_as_the_draft(qtbot: QtBot, tmp_path) -> None:
    import json

    import mlx.core as mx

    target = tmp_path / "Qwen3.6-27B"
    target.mkdir()
    config = {"model_type": "qwen3_5", "text_config": {"mtp_num_hidden_layers": 1}}
    (target / "config.json").write_text(json.dumps(config))
    # As mlx-lm converts it, the config names the head and the weights leave it out.
    mx.save_safetensors(str(target / "model.safetensors"), {"lm_head.weight": mx.zeros((2, 2))})
    headless = ModelBar(Settings(target=str(target)))
    qtbot.addWidget(headless)
    headless.draft_picker.menu().aboutToShow.emit()
    assert "Built-in (MTP)" not in [a.text() for a in headless.draft_picker.menu().actions()]
    mx.save_safetensors(str(target / "model.safetensors"), {"mtp.fc.weight": mx.zeros((2, 2))})
    plain = tmp_path / "Qwen2.5-7B"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    bar = ModelBar(Settings(target=str(target)))
    qtbot.addWidget(bar)
    menu = bar.draft_picker.menu()
    menu.aboutToShow.emit()
    built_in = [a for a in menu.actions() if a.text() == "Built-in (MTP)"]
    assert len(built_in) == 1
    built_in[0].trigger()
    assert bar.draft() == "mtp" and bar.draft_edit.text() == "Built-in (MTP)"
    with qtbot.waitSignal(bar.load_requested) as blocker:
        bar.request_load()
    assert blocker.args == [str(target), "mtp"]
    # A target without a head offers none.
    bar.set_pair(str(plain), "")
    menu.aboutToShow.emit()
    assert "Built-in (MTP)" not in [a.text() for a in menu.actions()]
