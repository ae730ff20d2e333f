"""Acceptance along stretches: where a round starts decides what a longer draft is worth.

A draft agrees with the target in stretches that end at a rejection. A round
after a rejection starts a new stretch; a round after a full acceptance goes
on from where the last one stopped, unless the bonus token (which nothing
tests) was where the stretch ended. Per-position acceptance
(:class:`app.engine.adaptive.Acceptance`) pools both kinds of round, so it
cannot see that a draft one token longer can take a stretch's end into its
bonus token and start the next round afresh, where a shorter one leaves the
next round to begin on a rejection. (The synthetic pairs' misses repeat
every 64 tokens, and there the best fixed k beat per-position Auto by 10 %.)

So acceptance is also kept by distance from a stretch's start
(:class:`StretchTable`). A stream carries a :data:`Belief` over the distance
its next round starts at, since a full acceptance leaves it unseen, and each
round's evidence is shared between the distances it may have started at
(Bayes, with the table's own rates). :func:`best_policy` takes stretches to
renew and picks the k after a rejection and the k after a full acceptance of
highest long-run tokens per second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import mul

# A stream's belief over the distance from a stretch's start at which its next
# round starts: (distance, chance) pairs, the chances summing to 1.
Belief = tuple[tuple[int, float], ...]
FRESH: Belief = ((0, 1.0),)  # a new stretch: a reply's first round, or after a rejection

STRETCH_PRIOR = 3.0  # rounds' worth of evidence a distance's prior is
PRUNE = 0.01  # distances less likely than this are dropped from a belief


class StretchTable:
    """Acceptance by distance from a stretch's start.

    Distance x's rate is the chance that the draft of the x-th token after a
    stretch's start is accepted, given that every one before it was. A
    distance seen little leans on the one before it (errs long, as
    :meth:`app.engine.adaptive.Acceptance.rates`); distances past the last
    pool into it.

    Args:
        distances: Distances kept.
        decay: Per round, as per-position acceptance fades.
    """

    def __init__(self, distances: int, decay: float = 0.98) -> None:
        self.decay = decay
        self._reached = [0.0] * distances
        self._accepted = [0.0] * distances

    @property
    def distances(self) -> int:
        """Distances kept."""
        return len(self._reached)

    def rates(self, alpha: float) -> list[float]:
        """Acceptance at each distance, leaning on ``alpha`` (the pooled rate) where unseen."""
        out, lean = [], alpha
        for r, a in zip(self._reached, self._accepted, strict=True):
            lean = min((a + lean * STRETCH_PRIOR) / (r + STRETCH_PRIOR), 0.999)
            out.append(lean)
        return out

    def observe(
        self, belief: Belief, k: int, accepted: int, alpha: float, share: float = 1.0
    ) -> Belief:
        """Records a round that started as ``belief`` says; the belief of the round after it.

        Args:
            belief: Where the round may have started.
            k: Tokens it proposed (at least 1).
            accepted: The first ones kept.
            alpha: The pooled rate, for distances not yet seen.
            share: The part of a round this is: the table fades by ``decay ** share``.
        """
        rates, last = self.rates(alpha), self.distances - 1
        full = accepted >= k
        post: dict[int, float] = {}  # how likely each start is, given what the round did
        for t, w in belief:
            for i in range(accepted):
                w *= rates[min(t + i, last)]
            post[t] = w if full else w * (1.0 - rates[min(t + accepted, last)])
        total = sum(post.values())
        if total <= 0.0:
            post, total = {0: 1.0}, 1.0
        fade = self.decay**share
        for i in range(self.distances):
            self._reached[i] *= fade
            self._accepted[i] *= fade
        after: dict[int, float] = {}
        for t, w in post.items():
            w /= total
            for i in range(min(k, accepted + 1)):
                x = min(t + i, last)
                self._reached[x] += w
                if i < accepted:
                    self._accepted[x] += w
            if full:  # the bonus token's place is untested: the stretch may have ended there
                on = rates[min(t + k, last)]
                nxt = min(t + k + 1, last)
                after[nxt] = after.get(nxt, 0.0) + w * on
                after[0] = after.get(0, 0.0) + w * (1.0 - on)
        if not full:
            return FRESH
        kept = {t: w for t, w in after.items() if w >= PRUNE}
        norm = sum(kept.values())
        return tuple(sorted((t, w / norm) for t, w in kept.items()))


@dataclass(frozen=True)
class Policy:
    """A stretch policy: k after a rejection, k after a full acceptance, and their rate.

    Attributes:
        after_miss: k of a round that starts a stretch.
        after_full: k of a round after a full acceptance.
        rate: Long-run tokens per second of the pair.
        same: ``same[k]``: the rate of playing k in both (index 0 unused).
    """

    after_miss: int
    after_full: int
    rate: float
    same: tuple[float, ...]

    def k(self, belief: Belief) -> int:
        """The k for a round that starts as ``belief`` says."""
        return self.after_miss if belief == FRESH else self.after_full


def best_policy(rates: Sequence[float], seconds: Sequence[float], k_max: int) -> Policy:
    """The (k after a rejection, k after a full acceptance) of highest long-run rate.

    Stretches renew: a stretch's start (after a rejection, or after a bonus
    token that fell where the stretch ended, unseen) forgets what came
    before. From a start, rounds run along the stretch until one ends in a
    rejection (the next start is known: state M, which plays ``after_miss``)
    or in a bonus on the stretch's end (a start taken for a continuation:
    state B, which plays ``after_full`` from distance 0). The two starts form
    a two-state chain, whose long-run rate is the policy's.

    Args:
        rates: Acceptance by distance from a stretch's start (the last repeats).
        seconds: ``seconds[k]``: a round of k drafts (index 0 unused).
        k_max: Longest draft.
    """
    last = len(rates) - 1
    ext = [*rates, *[rates[-1]] * (k_max + 1)]
    # full[t][k]: the chance that k drafts from distance t are all accepted; tokens[t][k]: E(k).
    full = [list(accumulate(ext[t : t + k_max], mul, initial=1.0)) for t in range(last + 1)]
    tokens = [list(accumulate(p)) for p in full]
    ks = range(1, k_max + 1)
    # Per k: from distance t, playing k until the next start, the expected
    # tokens, seconds, and chance of ending in state B.
    along = [_along(k, tokens, full, ext, seconds[k], last) for k in ks]
    best = (1, 1, -1.0)
    same = [0.0]
    for km in ks:
        e, p, on_end, sm = tokens[0][km], full[0][km], ext[km], seconds[km]
        on, to_b, n = p * on_end, p * (1.0 - on_end), km + 1
        for kb, (gt, gs, gb) in zip(ks, along, strict=True):
            # Stationary weights: π_M ∝ 1 - q_B, π_B ∝ q_M.
            wm, wb = 1.0 - gb[0], to_b + on * gb[n]
            rate = (wm * (e + on * gt[n]) + wb * gt[0]) / (wm * (sm + on * gs[n]) + wb * gs[0])
            if rate > best[2]:
                best = (km, kb, rate)
            if kb == km:
                same.append(rate)
    return Policy(best[0], best[1], best[2], tuple(same))


def _along(
    k: int,
    tokens: list[list[float]],
    full: list[list[float]],
    ext: list[float],
    seconds: float,
    last: int,
) -> tuple[list[float], list[float], list[float]]:
    """From each distance, playing ``k`` to the next start: tokens, seconds, chance of B."""
    e, p, on_end = tokens[last][k], full[last][k], ext[last]
    stay = 1.0 - p * on_end  # past the last distance, every round is as at the last
    n = last + k + 2
    gt, gs, gb = [e / stay] * n, [seconds / stay] * n, [p * (1.0 - on_end) / stay] * n
    for t in range(last - 1, -1, -1):
        e, p, on_end = tokens[t][k], full[t][k], ext[t + k]
        on, nxt = p * on_end, t + k + 1
        gt[t] = e + on * gt[nxt]
        gs[t] = seconds + on * gs[nxt]
        gb[t] = p * (1.0 - on_end) + on * gb[nxt]
    return gt, gs, gb


__all__ = ["FRESH", "Belief", "Policy", "StretchTable", "best_policy"]
