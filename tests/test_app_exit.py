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
    for _ in range(3):  # the unclean teardown was intermittent
        r = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(tiny.target), str(tiny.copy), str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert r.returncode == 0, r.stderr
        assert "reply-tokens" in r.stdout
        assert "terminate called" not in r.stderr
        assert "Traceback" not in r.stderr
