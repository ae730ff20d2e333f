"""Adaptive draft length: pick k to maximise expected tokens per second.

With per-token acceptance a (the chance that a drafted token survives, given
its predecessors did), a round that drafts k tokens commits
E(k) = (1 - a^(k+1)) / (1 - a) tokens on average (Leviathan et al. 2023) and
costs T(k) = k*c + v(k): k draft steps plus one verification of k + 1 tokens.
Both are measured as the reply runs; k = argmax E(k) / T(k) within [1, k_max].
"""

from __future__ import annotations

import itertools


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens a round of ``k`` drafts commits, bonus or correction included."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class _Ema:
    __slots__ = ("decay", "value")

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.value: float | None = None

    def add(self, x: float) -> None:
        self.value = x if self.value is None else self.decay * self.value + (1 - self.decay) * x


class DraftLength:
    """Chooses k each round, fixed or adaptive.

    Args:
        k_max: Upper bound of k.
        fixed: A fixed k; ``None`` adapts.
        explore_every: In adaptive mode, try a neighbouring k this often so the
            cost estimates stay current.
    """

    def __init__(self, k_max: int = 8, fixed: int | None = None, explore_every: int = 8) -> None:
        self.k_max = max(1, k_max)
        self.fixed = fixed
        self.explore_every = explore_every
        self._accepted = _Ema(0.9)  # accepted tokens per round
        self._trials = _Ema(0.9)  # tokens tested per round (accepted + first rejection)
        self._cost: dict[int, _Ema] = {}
        self._rounds = itertools.count()
        self._best = min(4, self.k_max)

    @property
    def acceptance(self) -> float:
        """Running per-token acceptance a, with a prior of 0.6."""
        acc, trials = self._accepted.value, self._trials.value
        if acc is None or not trials:
            return 0.6
        return min(acc / trials, 0.999)

    def cost(self, k: int) -> float | None:
        """Measured, or inferred from a linear fit, seconds of a round with ``k`` drafts."""
        ema = self._cost.get(k)
        if ema is not None and ema.value is not None:
            return ema.value
        points = [(j, e.value) for j, e in self._cost.items() if e.value is not None and j > 0]
        if not points:
            return None
        if len(points) == 1:
            # One point: assume half of a round's cost scales with its tokens.
            j, t = points[0]
            return t * (0.5 + 0.5 * (k + 1) / (j + 1))
        n = len(points)
        mean_k = sum(j for j, _ in points) / n
        mean_t = sum(t for _, t in points) / n
        var = sum((j - mean_k) ** 2 for j, _ in points)
        slope = sum((j - mean_k) * (t - mean_t) for j, t in points) / var
        return max(mean_t + max(slope, 0.0) * (k - mean_k), 1e-9)

    def choose(self) -> int:
        """The k for the next round."""
        if self.fixed is not None:
            return self.fixed
        alpha = self.acceptance
        best, best_rate = self._best, -1.0
        seen = [j for j, e in self._cost.items() if e.value is not None]
        for k in range(1, self.k_max + 1):
            # Trust the cost model only next to measured k: far extrapolations of
            # noisy timings would send k to an extreme.
            if seen and min(abs(k - j) for j in seen) > 1:
                continue
            cost = self.cost(k)
            if cost is None:
                continue
            rate = expected_tokens(alpha, k) / cost
            if rate > best_rate:
                best, best_rate = k, rate
        self._best = best
        n = next(self._rounds)
        if n and n % self.explore_every == 0:
            step = 1 if (n // self.explore_every) % 2 else -1
            return min(max(best + step, 1), self.k_max)
        return best

    def observe(self, k: int, accepted: int, seconds: float) -> None:
        """Records a round: ``k`` drafted, ``accepted`` kept, ``seconds`` spent."""
        if k <= 0:
            return
        self._accepted.add(accepted)
        self._trials.add(accepted + (1 if accepted < k else 0))
        self._cost.setdefault(k, _Ema(0.8)).add(seconds)
