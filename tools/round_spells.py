"""How a bench run's rounds took their time, repeat by repeat: whether steps ran in spells.

Reads the JSON that ``tandem bench --json`` writes (each Tandem row keeps its rounds:
k, width, ms, timed, ms since the first token). For every row and repeat it prints the
tok/s, then for Tandem's rows the plain steps' median ms and the drafting rounds'
count and median ms. mlx-lm's plain loop keeps no rounds: its tok/s per repeat is the
reference a plain step of Tandem's is held against (1000 / tok/s ms a token).

    PYTHONPATH=. python3 tools/round_spells.py BENCH.json [BENCH.json ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def repeats(rounds: list[list[float]]) -> list[list[list[float]]]:
    """The rounds of each reply: the time since the first token starts again with each."""
    out: list[list[list[float]]] = []
    for r in rounds:
        if not out or r[4] < out[-1][-1][4]:
            out.append([])
        out[-1].append(r)
    return out


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):6.1f}" if values else "     -"


def describe(row: dict[str, Any]) -> list[str]:
    """One line a reply: its tok/s, and where rounds were kept, their medians."""
    name = f"{row['impl']} k={row['k']}"
    tps = row.get("tps") or []
    replies = repeats(row.get("rounds") or [])
    lines = []
    for i, rate in enumerate(tps):
        line = f"{name:16} reply {i + 1}: {rate:7.1f} tok/s"
        if i < len(replies):
            plain = [r[2] for r in replies[i] if r[0] == 0]
            drafting = [r[2] for r in replies[i] if r[0] > 0]
            line += f"  plain steps {len(plain):4} median {_median(plain)} ms"
            line += f"  drafting rounds {len(drafting):4} median {_median(drafting)} ms"
        lines.append(line)
    return lines


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    for path in paths:
        data = json.loads(Path(path).read_text())
        print(f"== {path}")
        for row in data["rows"]:
            print("\n".join(describe(row)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
