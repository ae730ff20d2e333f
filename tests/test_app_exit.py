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


QUIT_MID_REPLY = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from PySide6.QtCore import QTimer
    from app.ui.application import run_app

    target, draft, data = sys.argv[1:4]

    def ready(window):
        def send(_info):
            window.composer.editor.setPlainText("Tell me everything")
            window.composer.send_button.click()

        def first(_batch):
            window.service.tokens_generated.disconnect(first)
            QTimer.singleShot(0, window.close)  # Ctrl+Q as the first tokens show

        window.service.pair_loaded.connect(send)
        window.service.tokens_generated.connect(first)

    sys.exit(run_app([sys.argv[0]], data_dir=Path(data), target=target, draft=draft,
                     on_ready=ready))
    """
)


@pytest.mark.slow
def test_quitting_mid_reply_keeps_it_as_stopped_with_its_numbers(
    tiny: TinyModels, tmp_path: Path
) -> None:
    import json

    from app.store import Store

    (tmp_path / "settings.json").write_text(json.dumps({"max_tokens": 100_000}))
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", QUIT_MID_REPLY, str(tiny.target), str(tiny.copy), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert run.returncode == 0, run.stderr
    store = Store(tmp_path / "tandem.sqlite3")
    try:
        [conversation] = store.conversations()
        reply = store.messages(conversation.id)[-1]
    finally:
        store.close()
    assert reply.role == "assistant" and reply.content
    assert reply.finish_reason == "cancelled"  # stopped by quitting, not an error
    assert reply.stats is not None and reply.stats.tokens > 0  # so it has its Stats… link
