"""Every event of every request of a ``tandem bench`` run, lone decoder and batch alike, timed.

Usage: python3 tools/solo_trace.py TRACE.jsonl BENCH-ARGS...
       e.g. python3 tools/solo_trace.py out/solo.jsonl --synthetic 70b:1b --bits 4 \
            --dtype bfloat16 --concurrent 1 --miss 0 --ks 15 --max-tokens 128 --fresh-shapes

One JSON line per event a request yields: which decoder ran it (``solo`` for
:class:`~app.engine.speculative.Decoder`, ``batch`` for
:class:`~app.engine.batch.BatchDecoder`), the request's number, the event's
kind, the seconds since the request opened and since its last event, and for
a round its k, accepted tokens, width, whether it was timed and the seconds it
says it took. Run 21 saw one stream through the batch run twice as fast as the
lone decoder on the same request; this says in which events the time goes.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Generator
from typing import Any

from app.cli import main
from app.engine.batch import BatchDecoder
from app.engine.speculative import Decoder, Round

path, argv = sys.argv[1], sys.argv[2:]
out = open(path, "w")  # noqa: SIM115 (open for the run)
numbers = itertools.count(1)  # each request opened, in order


def _traced(who: str, events: Generator[Any, None, None]) -> Generator[Any, None, None]:
    request = next(numbers)
    start = last = time.perf_counter()
    try:
        for event in events:
            now = time.perf_counter()
            row: dict[str, Any] = {
                "who": who,
                "request": request,
                "event": type(event).__name__,
                "at": now - start,
                "gap": now - last,
            }
            if isinstance(event, Round):
                row.update(
                    k=event.k,
                    accepted=event.accepted,
                    width=event.width,
                    timed=event.timed,
                    seconds=event.seconds,
                    draft_seconds=event.draft_seconds,
                )
            out.write(json.dumps(row) + "\n")
            out.flush()
            last = now
            yield event
    finally:
        events.close()  # closing the trace closes the request: it leaves its batch


real_solo, real_batch = Decoder.generate, BatchDecoder.generate


def _solo(self: Decoder, *args: Any, **kwargs: Any) -> Any:
    return _traced("solo", real_solo(self, *args, **kwargs))


def _batch(self: BatchDecoder, *args: Any, **kwargs: Any) -> Any:
    return _traced("batch", real_batch(self, *args, **kwargs))


Decoder.generate = _solo  # type: ignore[method-assign]
BatchDecoder.generate = _batch  # type: ignore[method-assign]
sys.exit(main(["bench", *argv]))
