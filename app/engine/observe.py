"""What a decoder tells its observers as it runs: immutable events, one per step of its work.

A decoder's observers (:meth:`~app.engine.decoder.Decoder.subscribe`) are
called on the engine thread with each event, so that ``/metrics``
(:class:`Totals`), ``tandem bench --trace`` and the tools see what a round
planned and cost without reaching into the decoder. An observer must be quick
and must not raise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace


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


@dataclass(frozen=True)
class PlainToken:
    """A plain step's token went out on its own: a probe, or a plain stretch."""


@dataclass(frozen=True)
class PromptCopied:
    """A joining request copied ``rows`` prompt rows from another's caches rather than read them."""

    rows: int


EngineEvent = RoundPlanned | RoundRun | PrefillChunk | PlainBurst | PlainToken | PromptCopied
Observer = Callable[[EngineEvent], None]


@dataclass(frozen=True, slots=True)
class BatchStats:
    """What a decoder has done since it was made, for ``/metrics``.

    Attributes:
        active: Requests open now.
        rounds: Rounds run, a plain step's included.
        drafted: Tokens proposed across requests.
        accepted: Of those, tokens the target kept.
        tokens: Tokens committed across requests.
        largest: Most requests one round verified together.
        shared: Prompt tokens a request copied from another's caches rather than read.
    """

    active: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    largest: int = 0
    shared: int = 0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


class Totals:
    """An observer that counts a decoder's work from its events: the figures ``/metrics`` serves."""

    def __init__(self) -> None:
        self._counts = BatchStats()

    def __call__(self, event: EngineEvent) -> None:
        c = self._counts
        if isinstance(event, RoundRun):
            self._counts = replace(
                c,
                rounds=c.rounds + 1,
                drafted=c.drafted + sum(event.ks),
                accepted=c.accepted + sum(event.accepted),
                tokens=c.tokens + sum(event.accepted) + len(event.ks),
                largest=max(c.largest, len(event.ks)),
            )
        elif isinstance(event, PlainToken):
            self._counts = replace(
                c, rounds=c.rounds + 1, tokens=c.tokens + 1, largest=max(c.largest, 1)
            )
        elif isinstance(event, PromptCopied):
            self._counts = replace(c, shared=c.shared + event.rows)

    def snapshot(self, active: int = 0) -> BatchStats:
        """The totals so far, with the requests open now."""
        return replace(self._counts, active=active)
