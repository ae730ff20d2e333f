"""A ``tandem bench --concurrent`` run with the draft's caches side by side across rounds, or not.

Usage: python3 tools/draft_side_ab.py on|off TRACE.jsonl BENCH-ARGS...
       e.g. python3 tools/draft_side_ab.py off out/off.jsonl --synthetic 8b:1b --bits 4 \
            --dtype bfloat16 --concurrent 4,8 --miss 0 --ks 15 --temps 0 --max-tokens 128

``off`` lays the drafting requests' caches out afresh every round and writes
them back after it, as the batch did before it kept them side by side; the
target's caches stay side by side either way. Every round is traced as
``tools/batch_trace.py`` traces it.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

from app.engine.batch import BatchDecoder

mode, argv = sys.argv[1], sys.argv[2:]
if mode not in ("on", "off"):
    sys.exit("the first argument is on or off")
if mode == "off":

    def _laid_side(self: BatchDecoder, drafting: Any, caches: Any) -> None:
        return None  # a Stack laid out for this round only

    BatchDecoder._laid_side = _laid_side  # type: ignore[method-assign, assignment]
sys.argv = [str(Path(__file__).with_name("batch_trace.py")), *argv]
runpy.run_path(sys.argv[0], run_name="__main__")
