"""SIGKILL the real app mid-reply or right after a save: the database stays whole.

The app runs as a subprocess on tiny models. A driver script (test code, not
the app's) wraps the window's store so that every committed save is printed as
a JSON line; the test reads those lines and kills the process at the moment it
wants, then reopens the database.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.store import Store
from tests.conftest import TinyModels

ROOT = Path(__file__).resolve().parents[1]

DRIVER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import app.services.chat_controller as chat_controller
    from app.store import Settings, SettingsFile
    from app.ui.application import run_app

    target, draft, data, max_tokens, prompt = sys.argv[1:6]
    chat_controller.REPLY_SAVE_INTERVAL = 0.25  # several saves before the test kills it
    SettingsFile(Path(data) / "settings.json").save(Settings(max_tokens=int(max_tokens)))

    def emit(*event):
        print(json.dumps(event), flush=True)

    def ready(window):
        store = window.store
        for name in ("add_message", "update_message"):
            def save(*args, _save=getattr(store, name), _name=name, **kwargs):
                m = _save(*args, **kwargs)  # committed when it returns
                emit("saved", _name, m.id, m.conversation_id, m.role, m.content, m.finish_reason)
                return m
            setattr(store, name, save)

        def send(_info):
            window.composer.editor.setPlainText(prompt)
            window.composer.send_button.click()

        window.service.pair_loaded.connect(send)
        window.service.generation_started.connect(lambda _rid: emit("streaming"))
        # Connected after the window's own slot, so the reply is saved by now.
        window.service.generation_finished.connect(lambda _r: emit("finished"))
        window.service.failed.connect(lambda f: emit("failed", f.message))

    sys.exit(run_app([sys.argv[0]], data_dir=Path(data), target=target, draft=draft,
                     on_ready=ready))
    """
)

Event = list[Any]


@pytest.fixture(scope="module")
def chatty(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny target and a copy as draft, never choosing end-of-text: replies run long."""
    import mlx.core as mx

    root = tmp_path_factory.mktemp("chatty")
    target = root / "chatty-target"
    shutil.copytree(tiny.target, target)
    eos = json.loads((target / "config.json").read_text())["eos_token_id"]
    weights = mx.load(str(target / "model.safetensors"))
    assert isinstance(weights, dict)
    head = weights["lm_head.weight"]
    # A zero row scores 0, below the best of the other random scores, so greedy never picks it.
    weights["lm_head.weight"] = mx.where(mx.arange(head.shape[0])[:, None] == eos, 0.0, head)
    mx.save_safetensors(str(target / "model.safetensors"), weights)
    draft = root / "chatty-draft"
    shutil.copytree(target, draft)
    return target, draft


def _run_until(
    pair: tuple[Path, Path],
    data: Path,
    max_tokens: int,
    prompt: str,
    kill_when: Callable[[list[Event]], bool],
) -> list[Event]:
    """Runs the app until ``kill_when(events so far)`` holds, SIGKILLs it, returns every event."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1"}
    args = [str(pair[0]), str(pair[1]), str(data), str(max_tokens), prompt]
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    events: list[Event] = []
    deadline = time.monotonic() + 120
    try:
        while not kill_when(events):
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            assert line is not None, f"the app ended first: {events}"
            events.append(json.loads(line))
            assert events[-1][0] != "failed", events[-1]
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    while (line := lines.get_nowait()) is not None:  # what it printed before it died
        events.append(json.loads(line))
    return events


def _saved(events: list[Event]) -> dict[int, Event]:
    """The last save of each message, by id: (name, id, conversation, role, content, reason)."""
    return {e[2]: e[1:] for e in events if e[0] == "saved"}


def _reopen(data: Path) -> Store:
    store = Store(data / "tandem.sqlite3")
    [[check]] = store._db.execute("PRAGMA integrity_check").fetchall()
    assert check == "ok"
    return store


@pytest.fixture(scope="module")
def killed_after_a_save(
    chatty: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[Event], Path]:
    """One run killed right after its reply was saved: its events and its data folder.

    Run once for the module; a test works on its own copy of the folder.
    """
    data = tmp_path_factory.mktemp("killed") / "data"
    data.mkdir()
    events = _run_until(chatty, data, 40, "Hello there", lambda ev: ["finished"] in ev)
    return events, data


def _copy_of(data: Path, tmp_path: Path) -> Path:
    """The killed app's data folder (database, journal and all), copied for one test."""
    return Path(shutil.copytree(data, tmp_path / "data"))


def test_a_kill_right_after_a_save_loses_nothing(
    killed_after_a_save: tuple[list[Event], Path], tmp_path: Path
) -> None:
    events, data = killed_after_a_save
    tmp_path = _copy_of(data, tmp_path)
    saved = _saved(events)
    assert [s[3] for s in saved.values()] == ["user", "assistant"]
    store = _reopen(tmp_path)
    try:
        [conversation] = store.conversations()
        user, reply = store.messages(conversation.id)
        assert (user.id, user.content) == (next(iter(saved)), "Hello there")
        _, _, cid, _, content, reason = saved[reply.id]
        assert (reply.conversation_id, reply.content, reply.finish_reason) == (cid, content, reason)
        assert reply.finish_reason == "length" and reply.stats is not None
        assert reply.stats.tokens == 40
    finally:
        store.close()


@pytest.mark.slow
def test_a_kill_while_a_reply_streams_keeps_it_up_to_its_last_save(
    chatty: tuple[Path, Path], killed_after_a_save: tuple[list[Event], Path], tmp_path: Path
) -> None:
    # A first run left a finished exchange, killed right after it was saved.
    events, data = killed_after_a_save
    tmp_path = _copy_of(data, tmp_path)
    first = _saved(events)

    def grown_twice(events: list[Event]) -> bool:
        assert ["finished"] not in events, "the reply ended before it was saved twice"
        updates = [e for e in events if e[0] == "saved" and e[1] == "update_message"]
        return len(updates) >= 2

    # The app restarts on the killed database, goes on with the chat and is killed mid-reply.
    events = _run_until(chatty, tmp_path, 3_000, "Now a long story", grown_twice)
    assert ["finished"] not in events  # it was still streaming
    second = _saved(events)
    store = _reopen(tmp_path)
    try:
        [conversation] = store.conversations()
        messages = store.messages(conversation.id)
        assert [m.id for m in messages] == [*first, *second]
        saved = {**first, **second}
        for m in messages[:-1]:  # as last saved
            assert [m.role, m.content, m.finish_reason] == saved[m.id][3:]
        partial = messages[-1]
        _, _, _, role, content, reason = second[partial.id]
        assert (role, reason) == ("assistant", "error")  # shown as interrupted
        # A save may have committed after its line was printed, never a loss.
        assert partial.content.startswith(content) and content
        assert partial.finish_reason == "error" and partial.stats is None
        assert len(partial.content) > len(first[messages[1].id][4])  # it ran long
    finally:
        store.close()
