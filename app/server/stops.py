"""OpenAI's ``stop`` strings: the reply ends before the first one, which is never sent.

The engine knows nothing of them; the server watches the reply's text as it
streams. Text that could still turn out to begin a stop string is held back
until the next delta says whether it does, so a stop string split across
tokens, deltas or draft rounds is caught and none of it reaches the client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from app.engine.types import Stats
from app.server.protocol import Event, ReplyFailed, ReplyFinished, TextDelta


class StopMatcher:
    """Finds the first of ``stops`` in text that arrives in pieces."""

    __slots__ = ("_held", "_stops")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """The text safe to send now, and whether a stop string was found.

        Once found, the text returned is all that comes before it; nothing of
        the stop string or after it is ever returned.
        """
        if not self._stops:
            return text, False
        text = self._held + text
        found = [i for s in self._stops if (i := text.find(s)) >= 0]
        if found:
            self._held = ""
            return text[: min(found)], True
        keep = max(_open_prefix(text, s) for s in self._stops)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """The text held back, once the reply ended without a stop string."""
        held, self._held = self._held, ""
        return held


def _open_prefix(text: str, stop: str) -> int:
    """The length of ``text``'s longest end that begins ``stop`` without completing it."""
    for start in range(max(0, len(text) - len(stop) + 1), len(text)):
        if stop.startswith(text[start:]):
            return len(text) - start
    return 0


async def until_stop(events: AsyncIterator[Event], stops: Sequence[str]) -> AsyncIterator[Event]:
    """``events`` with their text cut at the first stop string.

    A stop string found ends the events with ``ReplyFinished("stop")``, its
    usage counted from the deltas so far (the tokens the engine generated,
    the stop string's included); the caller then closes ``events``, which
    stops the reply.
    """
    matcher = StopMatcher(stops)
    tokens = 0
    prompt_tokens = 0
    async for event in events:
        if isinstance(event, TextDelta):
            tokens += event.tokens
            prompt_tokens = event.prompt_tokens or prompt_tokens
            text, stopped = matcher.feed(event.text)
            if text:
                yield TextDelta(text)
            if stopped:
                yield ReplyFinished("stop", Stats(prompt_tokens=prompt_tokens, tokens=tokens))
                return
            continue
        if isinstance(event, ReplyFinished | ReplyFailed):
            held = matcher.flush()
            if held:
                yield TextDelta(held)
        yield event
