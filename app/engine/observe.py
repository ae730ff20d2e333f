"""What a decoder tells an observer as it runs: immutable events, one per step of its work.

A decoder's ``observer`` (``None`` by default) is called on the engine thread
with each event, so that tools, ``tandem bench --trace`` and measurements see
what a round planned and cost without reaching into the decoder. An observer
must be quick and must not raise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RoundPlanned:
    """Auto planned a round: the draft lengths and what it expects of them."""

    ks: tuple[int, ...]  # one per request (a lone request: one)
    tokens: float
    seconds: float
    explore: bool  # a try of a longer draft than the best plan


@dataclass(frozen=True)
class RoundRun:
    """A drafting round ran: drafts verified in one target forward, each request's prefix kept."""

    ks: tuple[int, ...]
    accepted: tuple[int, ...]
    auto: bool
    timed: bool  # synced after drafting, so that drafting and verifying were timed apart
    stacked: bool  # the requests' drafts ran as one stacked forward
    priced: float | None  # seconds the batch's costs priced its shape at (several requests)
    seconds: float


@dataclass(frozen=True)
class PrefillChunk:
    """One forward read prompt rows into the target's cache."""

    rows: int
    requests: int
    seconds: float


@dataclass(frozen=True)
class PlainBurst:
    """Plain decoding of up to ``tokens`` tokens begins (Auto found drafting does not pay)."""

    tokens: int


EngineEvent = RoundPlanned | RoundRun | PrefillChunk | PlainBurst
Observer = Callable[[EngineEvent], None]
