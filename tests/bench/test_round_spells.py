"""``tools/round_spells.py`` reads a bench run's rounds reply by reply."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_each_reply_shows_its_plain_steps_and_drafting_rounds(tmp_path: Path) -> None:
    # (k, width, ms, timed, ms since the first token): the second reply starts again at 0.
    rounds = [[0, 1, 20.0, 0, 0.0], [0, 1, 22.0, 0, 20.0], [2, 3, 80.0, 0, 42.0]]
    rounds += [[0, 1, 30.0, 0, 0.0], [0, 1, 31.0, 0, 30.0], [0, 1, 32.0, 0, 61.0]]
    rows = [
        {"impl": "plain", "k": "0", "tps": [48.5, 45.8]},
        {"impl": "tandem", "k": "auto", "tps": [33.0, 32.0], "rounds": rounds},
    ]
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"meta": {}, "rows": rows}))

    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "round_spells.py"), str(bench)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()

    assert out[1:3] == [
        "plain k=0        reply 1:    48.5 tok/s",
        "plain k=0        reply 2:    45.8 tok/s",
    ]
    assert "plain steps    2 median   21.0 ms  drafting rounds    1 median   80.0 ms" in out[3]
    assert "plain steps    3 median   31.0 ms  drafting rounds    0 median      - ms" in out[4]
