"""One running reply on the engine thread: its events, pulled one at a time.

The engine thread runs several replies at once by pulling each in turn; a
reply that shares a :class:`~app.engine.decoder.Decoder` with others runs
one round for all of them when its turn finds its round not yet made. Text
leaves in :class:`TokenBatch` values at most every flush interval, so the UI
and the server see few signals however many replies run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from app.engine.types import Chunk, Finished, Origin, Reading, RoundStat, Segment, add_segments


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """Reply text, tokens and rounds since the previous batch.

    ``segments`` is ``text`` in runs by origin (``None`` for text that
    completes no token, such as the tail after the last one).
    ``prompt_tokens`` is the reply's prompt length, when the engine said.
    """

    request_id: int
    text: str
    token_ids: tuple[int, ...]
    origins: tuple[Origin, ...]
    segments: tuple[Segment, ...] = ()
    rounds: tuple[RoundStat, ...] = ()
    baseline_tps: float | None = None
    prompt_tokens: int | None = None


def _pieces(chunk: Chunk) -> tuple[list[str], list[Origin | None]]:
    """A chunk's text per token, with any text no token carries as origin ``None``."""
    pieces: list[str] = list(chunk.pieces)
    origins: list[Origin | None] = list(chunk.origins[: len(pieces)])
    rest = chunk.text[len("".join(pieces)) :]
    if rest:
        pieces.append(rest)
        origins.append(None)
    return pieces, origins


class ReplyStream:
    """Pulls one reply's events and hands them on, batched.

    Args:
        request_id: The reply's id, which every batch carries.
        events: The reply's readings, chunks and one :class:`Finished`.
        on_batch: Called with each :class:`TokenBatch`.
        on_reading: Called with a :class:`Reading`, at most every flush interval.
        on_finished: Called with the :class:`Finished` that ends the reply.
        flush_interval: Seconds between two batches while text streams.
        shared: Whether the reply runs in the shared batch.
    """

    def __init__(
        self,
        request_id: int,
        events: Iterator[Reading | Chunk | Finished],
        on_batch: Callable[[TokenBatch], None],
        on_reading: Callable[[Reading], None],
        on_finished: Callable[[Finished], None],
        flush_interval: float,
        shared: bool = False,
    ) -> None:
        self.request_id = request_id
        self.shared = shared
        self._events = events
        self._on_batch = on_batch
        self._on_reading = on_reading
        self._on_finished = on_finished
        self._interval = flush_interval
        self._pending: list[Chunk] = []
        self._flushed = time.monotonic()
        self._read_at: float | None = None

    def pump(self) -> bool:
        """Takes the reply's next event; ``False`` once it has ended.

        Raises:
            Exception: Whatever the reply's events raise; the text before it
                has been flushed.
        """
        try:
            event = next(self._events, None)
        except BaseException:
            self.flush()
            raise
        now = time.monotonic()
        if event is None:
            self.flush()
            return False
        if isinstance(event, Reading):
            if self._read_at is None or now - self._read_at >= self._interval:
                self._on_reading(event)
                self._read_at = now
        elif isinstance(event, Chunk):
            self._pending.append(event)
            if now - self._flushed >= self._interval:
                self.flush()
                self._flushed = now
        else:
            self.flush()
            self._on_finished(event)
            return False
        return True

    def close(self) -> None:
        """Ends the reply's events early (it was dropped)."""
        close = getattr(self._events, "close", None)
        if close is not None:
            close()

    def flush(self) -> None:
        """Hands on the text not yet handed on."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        segments: list[Segment] = []
        for c in pending:
            add_segments(segments, *_pieces(c))
        self._on_batch(
            TokenBatch(
                self.request_id,
                "".join(c.text for c in pending),
                tuple(t for c in pending for t in c.token_ids),
                tuple(o for c in pending for o in c.origins),
                tuple(segments),
                tuple(c.round for c in pending if c.round is not None),
                pending[-1].baseline_tps,
                next((c.prompt_tokens for c in pending if c.prompt_tokens), None),
            )
        )
