"""Running figures of speculation for the live acceptance gauge.

:class:`LiveStats` consumes :class:`~app.engine.types.RoundStat` values as a
reply streams and hands out immutable :class:`LiveSnapshot` values that the UI
can paint, so the gauge never reads mutable state across threads. When the
reply ends, :meth:`LiveStats.finish_message` puts the reply's final
:class:`~app.engine.types.Stats` in place of the live figures, so the gauge,
the status bar and Stats… show one value.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from app.engine.types import RoundStat, Stats, decode_rate, speedup_over


@dataclass(frozen=True, slots=True)
class LiveSnapshot:
    """The gauge's figures at one moment.

    Acceptance is accepted over proposed tokens; rounds that proposed nothing
    (``k == 0``) count for tokens and speed but never for acceptance. Speed
    and speedup are this message's, defined as :attr:`Stats.generation_tps
    <app.engine.types.Stats.generation_tps>` and :attr:`Stats.speedup
    <app.engine.types.Stats.speedup>` are.

    Attributes:
        rolling_acceptance: Over the last ``window`` rounds that proposed tokens,
            across messages of the pair (the "recent" figure); ``None`` if no
            such round.
        message_acceptance: Over this message's rounds; ``None`` if none drafted.
        lifetime_acceptance: Over the pair's lifetime (seeded totals plus the
            rounds added since); ``None`` if nothing was ever drafted.
        tps: This message's decoding speed (:func:`~app.engine.types.decode_rate`);
            ``None`` while its rounds took no measured time.
        baseline_tps: The pair's plain decoding speed, when known.
        speedup: ``tps`` over ``baseline_tps``; ``None`` if either is unknown.
        k: Tokens proposed in the last round; ``None`` before any round.
        auto: Whether the adaptive controller chose the last round's k.
        own_head: Whether the drafter is the target's own MTP head, not a draft model.
        draft_accepted: Accepted tokens of this message that the drafter proposed.
        lookup_accepted: Accepted tokens of this message that prompt lookup proposed.
        position_acceptance: For draft positions 1..``max_positions``, the share of
            this message's rounds with ``k >= i`` whose first ``i`` proposals all
            survived; ``None`` where no round proposed ``i`` tokens.
        rounds: Rounds of this message.
        tokens: Tokens committed in this message.
        drafted: Tokens proposed in this message.
    """

    rolling_acceptance: float | None = None
    message_acceptance: float | None = None
    lifetime_acceptance: float | None = None
    tps: float | None = None
    baseline_tps: float | None = None
    speedup: float | None = None
    k: int | None = None
    auto: bool = False
    own_head: bool = False
    draft_accepted: int = 0
    lookup_accepted: int = 0
    position_acceptance: tuple[float | None, ...] = ()
    rounds: int = 0
    tokens: int = 0
    drafted: int = 0

    @property
    def accepted(self) -> int:
        """Proposed tokens of this message that the target accepted."""
        return self.draft_accepted + self.lookup_accepted

    @property
    def lookup_share(self) -> float | None:
        """Prompt lookup's share of this message's accepted tokens; ``None`` if none."""
        total = self.draft_accepted + self.lookup_accepted
        return self.lookup_accepted / total if total else None

    @property
    def empty(self) -> bool:
        """Whether this message has nothing measured to show (no acceptance, no speed)."""
        return self.message_acceptance is None and self.tps is None


class LiveStats:
    """Accumulates rounds of decoding into the gauge's figures.

    Three scopes of acceptance: a rolling window of recent rounds (kept across
    messages), the current message (reset by :meth:`begin_message`, replaced
    by the final figures in :meth:`finish_message`) and the pair's lifetime
    (seeded by :meth:`set_lifetime`). :meth:`reset_pair` clears all three.
    Speed is the current message's only.

    Not thread-safe: feed it from one thread. The widgets that show it subscribe
    (:meth:`subscribe`) and are told each change, rather than being pushed snapshots.

    Args:
        window: Rounds in the rolling window.
        max_positions: Draft positions tracked by ``position_acceptance``.
    """

    def __init__(self, window: int = 32, max_positions: int = 12) -> None:
        if window < 1 or max_positions < 1:
            raise ValueError("window and max_positions must be at least 1")
        self.window = window
        self.max_positions = max_positions
        # (k, accepted) of drafting rounds.
        self._drafting: deque[tuple[int, int]] = deque(maxlen=window)
        self._baseline: float | None = None
        self._last_k: int | None = None
        self._last_auto = False
        self._own_head = False
        self._life_accepted = 0
        self._life_drafted = 0
        # Told a fresh snapshot whenever the figures change: the widgets that show them.
        self._listeners: list[Callable[[LiveSnapshot], None]] = []
        self.begin_message()

    def subscribe(self, listener: Callable[[LiveSnapshot], None]) -> None:
        """Calls ``listener`` with a snapshot now and whenever the figures change."""
        self._listeners.append(listener)
        listener(self.snapshot())

    def _changed(self) -> None:
        if self._listeners:
            snapshot = self.snapshot()
            for listener in self._listeners:
                listener(snapshot)

    def begin_message(self) -> None:
        """Starts a new message: clears its figures, keeps the window and lifetime."""
        self._rounds = 0
        self._tokens = 0
        self._seconds = 0.0
        self._accepted = 0
        self._drafted = 0
        self._lookup = 0
        self._reached = [0] * self.max_positions  # rounds with k >= i
        self._survived = [0] * self.max_positions  # of those, accepted >= i
        self._changed()

    def reset_pair(self, own_head: bool = False) -> None:
        """Clears everything, for a newly loaded pair; ``own_head``: it drafts with the
        target's own MTP head."""
        self._own_head = own_head
        self._drafting.clear()
        self._baseline = None
        self._last_k = None
        self._last_auto = False
        self._life_accepted = 0
        self._life_drafted = 0
        self.begin_message()

    def set_lifetime(self, accepted: int, drafted: int) -> None:
        """Sets the pair's lifetime totals; rounds added later count on top.

        The totals replace any earlier ones, so re-seeding from the stored
        messages after each reply is safe (nothing is counted twice).

        Args:
            accepted: Proposed tokens the target accepted, over stored messages.
            drafted: Tokens proposed, over stored messages.
        """
        self._life_drafted = max(drafted, 0)
        self._life_accepted = min(max(accepted, 0), self._life_drafted)
        self._changed()

    def add(self, rounds: Iterable[RoundStat], baseline_tps: float | None = None) -> None:
        """Counts rounds into every scope.

        Args:
            rounds: Rounds in decoding order.
            baseline_tps: The pair's plain decoding speed if known; ``None``
                keeps the last one given.
        """
        if baseline_tps is not None and baseline_tps > 0:
            self._baseline = baseline_tps
        for r in rounds:
            # Clamp rather than raise: a malformed round must not take the UI down.
            k = max(r.k, 0)
            accepted = min(max(r.accepted, 0), k)
            lookup = min(max(r.lookup, 0), accepted)
            self._last_k, self._last_auto = k, r.auto
            self._rounds += 1
            self._tokens += max(r.tokens, 0)
            self._seconds += max(r.seconds, 0.0)
            if k == 0:
                continue
            self._drafting.append((k, accepted))
            self._drafted += k
            self._accepted += accepted
            self._lookup += lookup
            self._life_drafted += k
            self._life_accepted += accepted
            for i in range(min(k, self.max_positions)):
                self._reached[i] += 1
                if accepted > i:
                    self._survived[i] += 1
        self._changed()

    def finish_message(self, stats: Stats) -> None:
        """Puts the reply's final figures in place of this message's live ones.

        Its speed becomes ``stats.generation_tps`` and ``stats.speedup`` exactly
        (the final round, cut at the end of text, reaches no live round), and
        its acceptance the reply's counts, with the lifetime corrected to match.
        Counters of a remote server that span other requests are left out.

        Args:
            stats: The ended reply's statistics.
        """
        self._tokens = max(stats.tokens, 0)
        self._seconds = max(stats.decode_seconds, 0.0)
        if stats.baseline_tps is not None and stats.baseline_tps > 0:
            self._baseline = stats.baseline_tps
        if stats.stats_scope not in (None, "request"):
            self._changed()
            return
        drafted = max(stats.drafted, 0)
        accepted = min(max(stats.accepted, 0), drafted)
        self._life_drafted = max(self._life_drafted + drafted - self._drafted, 0)
        self._life_accepted = min(
            max(self._life_accepted + accepted - self._accepted, 0), self._life_drafted
        )
        self._drafted, self._accepted = drafted, accepted
        self._lookup = min(max(stats.lookup_accepted, 0), accepted)
        self._changed()

    def snapshot(self) -> LiveSnapshot:
        """The figures now, as an immutable value."""
        rolling_drafted = sum(k for k, _ in self._drafting)
        rolling_accepted = sum(a for _, a in self._drafting)
        tps = decode_rate(self._tokens, self._seconds)
        return LiveSnapshot(
            rolling_acceptance=_ratio(rolling_accepted, rolling_drafted),
            message_acceptance=_ratio(self._accepted, self._drafted),
            lifetime_acceptance=_ratio(self._life_accepted, self._life_drafted),
            tps=tps,
            baseline_tps=self._baseline,
            speedup=speedup_over(tps, self._baseline, self._tokens),
            k=self._last_k,
            auto=self._last_auto,
            own_head=self._own_head,
            draft_accepted=self._accepted - self._lookup,
            lookup_accepted=self._lookup,
            position_acceptance=tuple(
                _ratio(s, n) for s, n in zip(self._survived, self._reached, strict=True)
            ),
            rounds=self._rounds,
            tokens=self._tokens,
            drafted=self._drafted,
        )


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None
