"""The real app, run as a subprocess: its log file and its unhandled-error dialog."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import platformdirs

from tests.conftest import TinyModels

ROOT = Path(__file__).resolve().parents[2]

# An exception escapes a slot of the real chat flow; the app must show it and go on.
SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox
    from app.ui.application import run_app

    target, draft, data, marker = sys.argv[1:5]

    def ready(window):
        def boom(_info):
            raise RuntimeError(marker)

        def send():
            window.composer.editor.setPlainText("Hello after an error")
            window.composer.send_button.click()

        def poll():
            shown = [w for w in QApplication.topLevelWidgets()
                     if isinstance(w, QMessageBox) and w.isVisible()]
            if not shown:
                QTimer.singleShot(20, poll)
                return
            print("dialog", shown[0].informativeText().replace("\\n", " | "), flush=True)
            shown[0].close()
            send()

        def done(result):
            print("reply-tokens", result.finished.stats.tokens, flush=True)
            QTimer.singleShot(0, window.close)

        window.service.pair_loaded.connect(boom)
        window.service.pair_loaded.connect(lambda _info: poll())
        window.service.generation_finished.connect(done)
        window.service.failed.connect(lambda f: (print("failed", f.message), window.close()))

    sys.exit(run_app([sys.argv[0]], data_dir=Path(data), target=target, draft=draft,
                     on_ready=ready))
    """
)


def test_an_unhandled_error_shows_a_dialog_is_logged_and_the_app_goes_on(
    tiny: TinyModels, tmp_path: Path
) -> None:
    marker = f"deliberate failure {uuid.uuid4().hex}"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny.target), str(tiny.copy), str(tmp_path), marker],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    log_file = Path(platformdirs.user_log_dir("Tandem", appauthor=False)) / "tandem.log"
    dialog = next(line for line in r.stdout.splitlines() if line.startswith("dialog "))
    assert f"RuntimeError: {marker}" in dialog
    assert str(log_file) in dialog
    # The chat still works after the error.
    assert "reply-tokens" in r.stdout and "failed" not in r.stdout
    # The log has the traceback, and so has the terminal.
    logged = log_file.read_text(encoding="utf-8")
    at = logged.index(f"RuntimeError: {marker}")
    assert "Traceback (most recent call last):" in logged[:at]
    assert "in boom" in logged[:at]
    assert "Tandem quit" in logged[at:]
    assert f"RuntimeError: {marker}" in r.stderr


UNUSABLE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from PySide6.QtWidgets import QMessageBox
    from app.ui.application import run_app

    def shown(box):  # the dialog, as the user would read it, closed at once
        print("dialog", box.text().replace("\\n", " | "), "|", box.informativeText(), flush=True)
        return int(QMessageBox.StandardButton.Close)

    QMessageBox.exec = shown
    sys.exit(run_app([sys.argv[0]], data_dir=Path(sys.argv[1])))
    """
)


def test_an_unusable_data_folder_is_one_line_and_a_dialog_that_says_what_to_do(
    tmp_path: Path,
) -> None:
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("chats live elsewhere")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, "-c", UNUSABLE, str(a_file)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 1
    assert r.stderr.strip() == f"Tandem: unusable data folder: {a_file} is not a folder"
    assert "Traceback" not in r.stderr
    dialog = next(line for line in r.stdout.splitlines() if line.startswith("dialog "))
    assert f"{a_file} is not a folder" in dialog and "--data-dir" in dialog
    assert a_file.read_text() == "chats live elsewhere"  # nothing was lost
