"""``tandem bench --trace FILE``: every decoder event of the run, one JSON line each.

Each decoder the bench makes is attached in turn and numbered (each run of
several requests opens a fresh batch); a line is ``{"decoder": n, "event":
"RoundRun", ...}`` with the event's fields (:mod:`app.engine.observe`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Protocol, TypeVar

from app.engine.observe import EngineEvent, Observer


class Observed(Protocol):
    def subscribe(self, observer: Observer) -> None: ...


D = TypeVar("D", bound=Observed)


@dataclass
class _Trace:
    out: IO[str]
    decoders: int = 0


_open: list[_Trace] = []  # the run's trace, while one is open


def start(path: Path) -> None:
    """Opens ``path`` for the run's events (the bench checked it may write there)."""
    _open[:] = [_Trace(path.open("w", encoding="utf-8"))]


def stop() -> None:
    for trace in _open:
        trace.out.close()
    _open.clear()


def attach(decoder: D) -> D:
    """``decoder``, writing its events to the trace when one is open."""
    if not _open:
        return decoder
    trace = _open[0]
    trace.decoders += 1
    number = trace.decoders

    def write(event: EngineEvent) -> None:
        row = {"decoder": number, "event": type(event).__name__, **asdict(event)}
        trace.out.write(json.dumps(row) + "\n")

    decoder.subscribe(write)
    return decoder
