"""The app quits cleanly after the engine thread generated a reply."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import TinyModels

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from PySide6.QtCore import QTimer
    from app.ui.application import run_app

    target, draft, data = sys.argv[1:4]

    def ready(window):
        def send(_info):
            window.composer.editor.setPlainText("Hello, engine thread")
            window.composer.send_button.click()

        def done(result):
            print("reply-tokens", result.finished.stats.tokens, flush=True)
            QTimer.singleShot(0, window.close)

        window.service.pair_loaded.connect(send)
        window.service.generation_finished.connect(done)
        window.service.failed.connect(lambda f: (print("failed", f.message), window.close()))

    sys.exit(run_app([sys.argv[0]], data_dir=Path(data), target=target, draft=draft,
                     on_ready=ready))
    """
)


@pytest.mark.slow
def test_app_exits_cleanly_after_a_reply(tiny: TinyModels, tmp_path: Path) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1"}
    # The unclean teardown was intermittent: three runs, side by side to save time.
    runs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                SCRIPT,
                str(tiny.target),
                str(tiny.copy),
                str(tmp_path / str(i)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=Path(__file__).resolve().parents[1],
        )
        for i in range(3)
    ]
    for run in runs:
        stdout, stderr = run.communicate(timeout=120)
        assert run.returncode == 0, stderr
        assert "reply-tokens" in stdout
        assert "terminate called" not in stderr
        assert "Traceback" not in stderr
