"""tok/s of real replies in the window with the speculation panel shown and hidden.

Usage (the real pair from ``make demo-models``):

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 QT_QPA_PLATFORM=offscreen \\
        .venv/bin/python tools/bench_panel.py --model TARGET --draft DRAFT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a hash map is in three sentences.",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from app.services import EngineService
    from app.store import SettingsFile, Store
    from app.ui.main_window import MainWindow

    app = QApplication(sys.argv)
    tmp = Path(tempfile.mkdtemp())
    store, service = Store(tmp / "db.sqlite3"), EngineService()
    settings = SettingsFile(tmp / "s.json")
    settings.save(settings.load().updated(max_tokens=args.max_tokens))
    window = MainWindow(store, service, settings, models_dir=tmp)
    window.show()

    def wait(signal: Any) -> Any:
        loop, out = QEventLoop(), []

        def done(*a: Any) -> None:
            out.append(a)
            loop.quit()

        signal.connect(done)
        QTimer.singleShot(600_000, loop.quit)
        loop.exec()
        return out[0][0] if out else None

    window.model_bar.target_edit.setText(args.model)
    window.model_bar.draft_edit.setText(args.draft)
    window.model_bar.load_button.click()
    if wait(service.pair_loaded) is None:
        print("the pair did not load", file=sys.stderr)
        return 1
    window.panel.set_num_draft(args.k)

    def reply(text: str) -> float:
        window.chat_view.new_conversation()
        window.composer.editor.setPlainText(text)
        window.composer.send_button.click()
        return float(wait(service.generation_finished).finished.stats.generation_tps)

    reply("Warm up.")
    results: dict[str, list[float]] = {"shown": [], "hidden": []}
    for _ in range(args.rounds):
        for mode in ("shown", "hidden"):
            window.menus.panel_action.setChecked(mode == "shown")
            for prompt in PROMPTS:
                results[mode].append(reply(prompt))
                print(mode, f"{results[mode][-1]:.2f} tok/s", flush=True)
    summary = {m: {"median": statistics.median(v), "runs": v} for m, v in results.items()}
    print(json.dumps(summary))
    window.close()
    service.shutdown()
    store.close()
    app.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
