"""Measures how smoothly a long reply streams into the transcript.

Streams a synthetic reply of about 4,000 tokens (paragraphs, lists, code blocks
and a table, with runs of alternating origins) into an offscreen TranscriptView
after a few earlier messages, in batches the size of ~30 Hz updates at
120 tokens per second, and prints milliseconds per update (median and max),
the final render at ``end_reply`` and the total.

Run: ``QT_QPA_PLATFORM=offscreen .venv/bin/python tools/bench_transcript.py``
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtWidgets import QApplication

from app.engine.types import Origin, Segment
from app.store import StoredMessage
from app.ui.transcript import TranscriptView

_ORIGINS = (Origin.DRAFT, Origin.DRAFT, Origin.BONUS, Origin.TARGET, Origin.CORRECTION)
_PARAGRAPH = (
    "Speculative decoding lets a small **draft** model propose several tokens that the "
    "large *target* model checks in one forward pass; accepted tokens cost almost nothing, "
    "and a rejected one is replaced by the target's own choice, so the output is `exactly` "
    "what the target alone would write."
)
_LIST = "- first point about caches\n- second point, with `code`\n- third point **in bold**\n"
_CODE = (
    "```python\n"
    "def accept(p: float, q: float) -> bool:\n"
    "    # Keep the drafted token with probability min(1, p / q).\n"
    "    return random.random() < min(1.0, p / q)\n"
    "```\n"
)
_TABLE = "| k | tokens/s | acceptance |\n|---|---:|---:|\n| 2 | 41.5 | 78% |\n| 4 | 52.0 | 66% |\n"


def synthetic_reply(tokens: int) -> list[str]:
    """Pieces of a Markdown reply, about one token each."""
    blocks = [_PARAGRAPH, _LIST, _PARAGRAPH, _CODE, _TABLE, f"## Section\n\n{_PARAGRAPH}"]
    pieces: list[str] = []
    i = 0
    while len(pieces) < tokens:
        text = blocks[i % len(blocks)] + "\n\n"
        pieces += re.findall(r"\s*\S{1,4}|\s+", text)
        i += 1
    return pieces[:tokens]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--rate", type=float, default=120.0, help="tokens per second")
    parser.add_argument("--hz", type=float, default=30.0, help="updates per second")
    parser.add_argument("--history", type=int, default=20, help="earlier messages shown")
    args = parser.parse_args()

    app = QApplication.instance() or QApplication([])
    view = TranscriptView()
    view.resize(900, 700)
    view.show()
    earlier = [
        StoredMessage(
            i + 1,
            1,
            "user" if i % 2 == 0 else "assistant",
            _PARAGRAPH + "\n\n" + _LIST + "\n" + _CODE,
            0.0,
        )
        for i in range(args.history)
    ]
    view.show_messages(earlier)
    app.processEvents()

    pieces = synthetic_reply(args.tokens)
    per_batch = max(1, round(args.rate / args.hz))
    view.begin_reply()
    updates: list[float] = []
    segments: list[Segment] = []
    started = time.perf_counter()
    for b in range(0, len(pieces), per_batch):
        batch: list[Segment] = [
            (_ORIGINS[(b + k) % len(_ORIGINS)], piece)
            for k, piece in enumerate(pieces[b : b + per_batch])
        ]
        segments += batch
        t0 = time.perf_counter()
        view.append_segments(batch)
        app.processEvents()  # layout and paint, as the event loop would
        updates.append((time.perf_counter() - t0) * 1000)
    t0 = time.perf_counter()
    view.end_reply(message_id=999, stats_id=999)
    app.processEvents()
    final = (time.perf_counter() - t0) * 1000
    total = (time.perf_counter() - started) * 1000

    # Showing the conversation again renders every reply: the cost of switching to it.
    reply = StoredMessage(999, 1, "assistant", "".join(pieces), 0.0, segments=tuple(segments))
    t0 = time.perf_counter()
    view.show_messages([*earlier, reply])
    app.processEvents()
    shown = (time.perf_counter() - t0) * 1000

    chars = sum(len(p) for p in pieces)
    print(f"{len(pieces)} tokens, {chars} characters, {len(updates)} updates of {per_batch} tokens")
    p95 = statistics.quantiles(updates, n=20)[-1]
    print(
        f"per update: median {statistics.median(updates):.2f} ms, p95 {p95:.2f} ms,"
        f" max {max(updates):.2f} ms (update {updates.index(max(updates))});"
        f" max after the first update {max(updates[1:]):.2f} ms"
    )
    print(f"end_reply (whole reply rendered once): {final:.1f} ms")
    print(f"total: {total:.0f} ms ({sum(updates):.0f} ms in updates)")
    print(f"show_messages of the {len(earlier) + 1} messages afterwards: {shown:.1f} ms")
    view.close()


if __name__ == "__main__":
    main()
