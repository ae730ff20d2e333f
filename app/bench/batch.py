"""What one target forward costs for several sequences: batched, joint, or one by one.

``tandem bench --batch-profile`` measures it, as the ground for verifying
several requests' drafts in one forward: mlx-lm's batching gives the model a
(sequences, rows) input over one batched cache; the engine's joint forward
(:func:`app.engine.merged.joint_forward`) packs the rows of a Llama-kind
model into one matrix, and runs a hybrid's over its sequences' own caches merged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from app.engine.caches import prefill
from app.engine.costs import probe_tokens, timed_runs, vocab_size
from app.engine.merged import joint_forward, mergeable
from app.engine.packed import packable
from app.engine.stacked import Stack, stackable, stacked_step

SEQUENCES = (1, 2, 4, 8)
ROWS = (1, 4, 8, 16)


@dataclass(frozen=True, slots=True)
class BatchCost:
    """One cached target forward of ``sequences`` sequences of ``rows`` new tokens each.

    Attributes:
        sequences: Sequences in the forward.
        rows: New tokens of each.
        batched: Seconds as one (sequences, rows) input over a batched cache.
        packed: Seconds of the engine's joint forward (rows packed into one
            matrix, or a hybrid's caches merged); ``None`` where it has none.
        separate: Seconds of one forward per sequence, one after another (in
            one graph): what running the sequences apart costs.
        stacked: Seconds of one step with the caches side by side
            (:mod:`app.engine.stacked`, as the batch's draft steps run); one
            row each only, ``None`` elsewhere.
    """

    sequences: int
    rows: int
    batched: float
    packed: float | None
    separate: float | None = None
    stacked: float | None = None


def measure_batch_costs(
    target: nn.Module,
    *,
    sequences: Sequence[int] = SEQUENCES,
    rows: Sequence[int] = ROWS,
    context: int = 512,
    repeats: int = 2,
) -> list[BatchCost]:
    """Times one forward for every (sequences, rows) against caches of ``context`` tokens.

    Each shape runs once unmeasured (kernels are built), then ``repeats``
    times; the fastest counts. The caches are trimmed back after every forward.
    """
    from app.engine.caches import new_cache, rewind

    tokens = probe_tokens(vocab_size(target), context + max(rows))
    singles = [new_cache(target) for _ in range(max(sequences))]
    for cache in singles:
        prefill(target, cache, tokens[:context])
    can_pack = packable(target) or mergeable(target, singles)
    out = []
    for b in sequences:
        batch = new_cache(target)
        target(mx.array([tokens[:context]] * b), cache=batch)
        mx.eval([c.state for c in batch])  # the caches only: no logits of the whole context
        for m in rows:
            new = tokens[context : context + m]
            x = mx.array([new] * b)

            def batched(x: mx.array = x, batch: Any = batch, m: int = m) -> None:
                mx.eval(target(x, cache=batch))
                rewind(batch, m)

            def packed(new: list[int] = new, b: int = b, m: int = m) -> None:
                rows = [mx.array(new)] * b
                joint = joint_forward(target, rows, singles[:b])
                mx.eval(joint if joint is not None else target(rows[0][None], cache=singles[0]))
                for cache in singles[:b]:
                    rewind(cache, m)

            def separate(new: list[int] = new, b: int = b, m: int = m) -> None:
                x = mx.array(new)[None]
                mx.eval([target(x, cache=cache) for cache in singles[:b]])
                for cache in singles[:b]:
                    rewind(cache, m)

            stack = Stack(singles[:b], 1) if m == 1 and stackable(target, singles[:b]) else None

            def stacked(new: list[int] = new, b: int = b, stack: Any = stack) -> None:
                mx.eval(stacked_step(target, [mx.array(new)] * b, stack))
                stack.taken = 0  # the same column again: the caches are untouched

            out.append(
                BatchCost(
                    sequences=b,
                    rows=m,
                    batched=min(timed_runs(batched, 1 + repeats)[1:]),
                    packed=min(timed_runs(packed, 1 + repeats)[1:]) if can_pack else None,
                    separate=min(timed_runs(separate, 1 + repeats)[1:]),
                    stacked=min(timed_runs(stacked, 1 + repeats)[1:]) if stack else None,
                )
            )
    return out


def batch_table(costs: Sequence[BatchCost]) -> str:
    """ms per forward, batched / joint / one by one (/ stacked), one line per sequence count."""
    rows = sorted({c.rows for c in costs})
    stacks = any(c.stacked is not None for c in costs)
    ways = "batched / joint / one by one" + (" / stacked" if stacks else "")
    lines = [f"sequences x new tokens each: ms {ways}"]
    lines.append(f"{'B':>3} " + " ".join(f"{'m=' + str(m):>23}" for m in rows))

    def ms(t: float | None) -> str:
        return "-" if t is None else f"{t * 1e3:.1f}"

    for b in sorted({c.sequences for c in costs}):
        cells = []
        for m in rows:
            c = next((c for c in costs if c.sequences == b and c.rows == m), None)
            cell = "-" if c is None else f"{ms(c.batched)} / {ms(c.packed)} / {ms(c.separate)}"
            if c is not None and stacks:
                cell += f" / {ms(c.stacked)}"
            cells.append(cell)
        lines.append(f"{b:>3} " + " ".join(f"{cell:>23}" for cell in cells))
    return "\n".join(lines)


__all__ = ["ROWS", "SEQUENCES", "BatchCost", "batch_table", "measure_batch_costs"]
