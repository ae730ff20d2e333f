"""Adaptive draft length: pick each round's k from measured costs and acceptance.

A round that drafts k tokens commits E(k) tokens on average (from the running
per-position acceptance) and costs k·c + v̂(k + 1) (:mod:`app.engine.costs`).
Auto takes the k of highest E(k) / cost over the whole range [1, k_max], now
and then tries a longer draft from across the rest of the range so the
acceptance of far positions stays known, and while widths are unmeasured it
pads a round's verification to one of them, a few rounds per width. Where a
stream says where its round starts (:mod:`app.engine.stretch`), a k that
plays differently after a rejection and after a full acceptance replaces
that k if it is clearly faster.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import overload

from app.engine.costs import (
    K_MAX,
    PLAIN_BURST,
    CostModel,
    CostProfile,
    Plan,
    expected_tokens,
    plan_round,
)
from app.engine.stretch import Belief, Policy, StretchTable, best_policy

PRIOR = 0.6  # acceptance assumed before any round
PRIOR_WEIGHT = 4.0  # rounds of evidence the prior is worth
EVIDENCE = 8.0  # drafted positions seen before Auto may conclude that drafting does not pay
# Standard errors of optimism about acceptance before Auto stops drafting. Once
# plain, only the rare tries teach acceptance, so a dip of a few unlucky rounds
# near break-even would otherwise stop drafting for good (70b:1b at miss 0.28:
# plain 23.8 tok/s, k = 8 26.6, Auto stuck at plain after its estimate dipped).
DOUBT = 1.5
# Rounds seen (faded) after which the estimate alone decides, the tries teaching
# the rest: the acceptance's memory is about 50 rounds, so its error never shrinks,
# and doubt kept Auto drafting at 0.81-0.87x plain where its estimate was 6-16 %
# below plain (8b:1b at miss 0.1).
DOUBT_ROUNDS = 16
EXPLORE_EVERY = 16  # fewest rounds between two tries of a longer draft
EXPLORE_BUDGET = 0.02  # share of decoding time that tries of longer drafts may cost
# Longest plain burst: a burst runs until the budget allows the next try, and
# its last step is not pipelined, so long bursts lose less; a change of k from
# the window still waits at most this many tokens.
PLAIN_BURST_MAX = 256
MIN_GAIN = 0.01  # over Auto's k played in both states, for a stretch policy to replace it


class Ema:
    """An exponential moving average; ``value`` is ``None`` until the first sample."""

    __slots__ = ("decay", "value")

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.value: float | None = None

    def add(self, x: float) -> None:
        self.value = x if self.value is None else self.decay * self.value + (1 - self.decay) * x


class Acceptance:
    """Running per-position acceptance of one pair and proposal source.

    Position i counts the rounds that reached it (every earlier proposal was
    accepted) and the rounds that accepted it there. Old rounds fade, so the
    rates follow the conversation. Few observations lean on the pooled rate,
    and that on :data:`PRIOR`.
    """

    def __init__(self, positions: int = K_MAX, decay: float = 0.98) -> None:
        self.decay = decay
        self._reached = [0.0] * positions
        self._accepted = [0.0] * positions
        # Beside the table, acceptance along stretches: rounds reach up to twice as far.
        self.stretch = StretchTable(2 * (positions + 1), decay)

    @property
    def evidence(self) -> float:
        """Drafted positions seen (faded like the rates)."""
        return sum(self._reached)

    @property
    def alpha(self) -> float:
        """The pooled per-token acceptance."""
        reached, accepted = sum(self._reached), sum(self._accepted)
        return min((accepted + PRIOR * PRIOR_WEIGHT) / (reached + PRIOR_WEIGHT), 0.999)

    def rates(self, optimism: float = 0.0) -> tuple[float, ...]:
        """Acceptance at each position, given the ones before it were accepted.

        A position seldom reached leans on the one before it, not on the pooled
        rate: acceptance comes in easy stretches, so a draft that got this far
        tends to go on. That errs long, which the next rounds correct; erring
        short would never be corrected, since positions past k are never seen.

        Args:
            optimism: Standard errors of the pooled rate to add to each rate
                while fewer than :data:`DOUBT_ROUNDS` rounds are seen.
        """
        out: list[float] = []
        lean = alpha = self.alpha
        doubt = optimism if self._reached[0] < DOUBT_ROUNDS else 0.0
        error = math.sqrt(alpha * (1 - alpha) / (self.evidence + PRIOR_WEIGHT))
        for r, a in zip(self._reached, self._accepted, strict=True):
            lean = min((a + lean * PRIOR_WEIGHT) / (r + PRIOR_WEIGHT), 0.999)
            out.append(min(lean + doubt * error, 0.999))
        return tuple(out)

    def observe(self, k: int, accepted: int, share: float = 1.0) -> None:
        """A round proposed ``k`` tokens and the first ``accepted`` survived.

        ``share``: the part of a round this observation is. A batched round
        observes each of its requests; fading the table once per round in all
        keeps its memory as many rounds long whatever the batch's size (faded
        per request, eight requests left it a memory of a few rounds, and its
        far positions' rates noisy).
        """
        if k <= 0:
            return
        fade = self.decay**share
        for i in range(len(self._reached)):
            self._reached[i] *= fade
            self._accepted[i] *= fade
        for i in range(min(k, accepted + 1, len(self._reached))):
            self._reached[i] += 1.0
            if i < accepted:
                self._accepted[i] += 1.0

    def observe_stretch(self, belief: Belief, k: int, accepted: int, share: float = 1.0) -> Belief:
        """As :meth:`observe`, for a round that started as ``belief`` says; the next belief."""
        self.observe(k, accepted, share)
        if k <= 0:
            return belief
        return self.stretch.observe(belief, k, accepted, self.alpha, share)

    def stretch_rates(self) -> list[float]:
        """Acceptance by distance from a stretch's start (see :class:`StretchTable`)."""
        return self.stretch.rates(self.alpha)


class DraftLength:
    """Chooses each round's plan: k and the width of its verification.

    Args:
        k_max: Upper bound of k.
        fixed: A fixed k; ``None`` adapts.
        costs: The pair's running costs (shared by every controller of the pair).
        acceptance: Acceptance of the pair and source this controller drafts for.
        explore_every: In adaptive mode, try another k this often.
    """

    def __init__(
        self,
        k_max: int = 8,
        fixed: int | None = None,
        costs: CostModel | None = None,
        acceptance: Acceptance | None = None,
        explore_every: int = EXPLORE_EVERY,
    ) -> None:
        self.k_max = max(1, min(k_max, K_MAX))
        self.fixed = fixed
        self.costs = costs if costs is not None else CostModel()
        self.acceptance = acceptance if acceptance is not None else Acceptance()
        self.explore_every = explore_every
        self._since_explore = 0
        self._explored = 0
        # Seconds tries may still cost: the budget's share of the time run since
        # the last try, less what was charged for switching back to drafting.
        self._credit = 0.0
        # The last try's expected loss and the rate of the plan it replaced, until it reports.
        self._try: tuple[float, float] | None = None
        self._width: int | None = None  # the last drafting round's width, kept where it pays

    def choose(self, belief: Belief | None = None) -> Plan:
        """The plan of the next round.

        Args:
            belief: Where the stream's next round starts along a stretch, if
                the stream keeps one (see :meth:`observe`); without it, Auto
                plans as every round started alike.
        """
        plan = self._choose()
        if belief is not None:
            plan = self._along_stretch(plan, belief)
        if plan.k:
            self._width = plan.width
        return plan

    def _along_stretch(self, plan: Plan, belief: Belief) -> Plan:
        """Auto's plan, or the stretch policy's k for this start where that is clearly faster.

        Fixed k, plain decoding, tries and rounds that measure a width stay as they are.
        """
        if self.fixed is not None or plan.k == 0 or plan.explore or self.costs.missing():
            return plan
        profile = self.costs.profile()
        # Made afresh each round (about 0.3 ms of Python here): made every
        # fourth, a stale one cost 2.5 % on the 70b:1b simulation at miss 0.
        policy = self._stretch_policy(profile)
        if policy is None or policy.rate < (1.0 + MIN_GAIN) * policy.same[plan.k]:
            return plan
        k = policy.k(belief)
        if k == plan.k:
            return plan
        rates = self.acceptance.rates()
        return plan_round(profile, rates, self.k_max, k, keep=self._width) or plan

    def _stretch_policy(self, profile: CostProfile) -> Policy | None:
        """The best stretch policy for these costs and the acceptance so far."""
        c = profile.draft_step or 0.0
        seconds = [0.0]
        for k in range(1, self.k_max + 1):
            padded = profile.padded_round(k + 1, self._width)
            if padded is None:
                return None
            seconds.append(k * c + padded[0])
        rates = self.acceptance.stretch_rates()[: 2 * (self.k_max + 1)]
        return best_policy(rates, seconds, self.k_max)

    def _choose(self) -> Plan:
        profile = self.costs.profile()
        rates = self.acceptance.rates()
        if self.fixed is not None:
            plan = plan_round(profile, rates, self.k_max, self.fixed, keep=self._width)
            return plan or Plan(k=self.fixed, width=self.fixed + 1)
        # Plain decoding (k = 0) competes too: Auto is never slower than not drafting.
        # Measured acceptance may rule drafting out, or the costs alone, never the prior.
        plain = self.acceptance.evidence >= EVIDENCE or self._cannot_pay(profile)
        start = min(4, self.k_max)  # nothing measured yet: a short draft
        best = plan_round(profile, rates, self.k_max, plain=plain, keep=self._width)
        if best is not None and best.k == 0 and not self._plain_for_sure(profile):
            best = plan_round(profile, rates, self.k_max, plain=False, keep=self._width)
        best = best or Plan(k=start, width=start + 1)
        plan = best
        missing = [w for w in self.costs.missing() if w <= self.k_max + 1]
        if missing:
            # Measure one unmeasured width: pad to it, or draft fewer to reach it.
            w = next((w for w in missing if w >= best.k + 1), missing[-1])
            plan = replace(best, k=min(best.k or 4, w - 1), width=w)
        else:
            plan = self._explore(profile, rates, best)
        return plan

    def _cannot_pay(self, profile: CostProfile) -> bool:
        """Whether plain decoding wins even were every draft accepted."""
        ceiling = plan_round(profile, [1.0] * self.k_max, self.k_max, keep=self._width)
        return ceiling is not None and ceiling.k == 0

    def _plain_for_sure(self, profile: CostProfile) -> bool:
        """Whether plain decoding still wins with acceptance :data:`DOUBT` errors higher."""
        hopeful = plan_round(profile, self.acceptance.rates(DOUBT), self.k_max, keep=self._width)
        return hopeful is not None and hopeful.k == 0

    def charge(self, seconds: float) -> None:
        """Counts what switching back to drafting cost beside its round (the draft's catch-up).

        It comes out of the exploration budget, so tries that need a long
        catch-up come less often.
        """
        self._credit -= max(0.0, seconds)

    def tried(self, tokens: int, seconds: float) -> None:
        """Reports what the last try (a plan marked ``explore``) made and cost.

        What it lost beyond its expected loss comes out of the budget too:
        acceptance errs long, so a budget of expected losses alone let tries
        cost 4 % where it allows 2 (8b:1b at miss 0.1, simulated).
        """
        if self._try is None:
            return
        expected, rate = self._try
        self._try = None
        self.charge(seconds - tokens / rate - expected)

    def _explore(self, profile: CostProfile, rates: Sequence[float], best: Plan) -> Plan:
        """Now and then a longer draft, so the acceptance of far positions stays known.

        Shorter drafts teach nothing new: a round of k observes every position up
        to its first rejection. Tries spread over (best k, k_max] and are spaced
        so that they cost at most :data:`EXPLORE_BUDGET` of the time. While Auto
        decodes plainly, the try is the best drafting plan, as soon as the
        budget allows: without tries the acceptance and the round costs that
        ruled drafting out would never change again. Until then, the plain
        burst lasts as long as the budget needs to allow it.
        """
        self._since_explore += 1
        plain = best.k == 0
        due = plain or self._since_explore >= self.explore_every
        trial = self._trial(profile, rates, best) if due else None  # no planning while not due
        loss = max(0.0, 1.0 - trial.rate / best.rate) * trial.seconds if trial else 0.0
        if trial is not None and self._credit >= loss:
            # The try takes this plan's place: only the plans before it ran.
            self._credit = 0.0
            self._since_explore = 0
            self._explored += 1
            self._try = (loss, best.rate)
            return replace(trial, explore=True)
        if plain and best.seconds > 0:
            step = best.seconds / best.tokens
            need = (loss - self._credit) / (EXPLORE_BUDGET * step) if trial else 0.0
            burst = min(max(PLAIN_BURST, int(need) + 1), PLAIN_BURST_MAX)
            best = replace(best, tokens=float(burst), seconds=burst * step)
        self._credit += EXPLORE_BUDGET * best.seconds
        return best

    def _trial(self, profile: CostProfile, rates: Sequence[float], best: Plan) -> Plan | None:
        """The next try: the best drafting plan while plain, else a longer draft."""
        longer = [k for k in spread(self.k_max) if k > best.k]
        if not longer or best.rate <= 0:
            return None
        if best.k == 0:
            return plan_round(profile, rates, self.k_max, plain=False, keep=self._width)
        k = longer[self._explored % len(longer)]
        return plan_round(profile, rates, self.k_max, k, keep=self._width)

    @overload
    def observe(self, k: int, accepted: int, belief: Belief, share: float = 1.0) -> Belief: ...

    @overload
    def observe(self, k: int, accepted: int, belief: None = None, share: float = 1.0) -> None: ...

    def observe(
        self, k: int, accepted: int, belief: Belief | None = None, share: float = 1.0
    ) -> Belief | None:
        """Records a round: ``k`` proposed, the first ``accepted`` kept.

        Args:
            k: Tokens proposed.
            accepted: The first ones kept.
            belief: Where the round started along a stretch, if the stream keeps one.
            share: The part of a round this observation is (see :meth:`Acceptance.observe`).

        Returns:
            Where the stream's next round starts, or ``None`` for a stream that
            keeps no belief.
        """
        if belief is None:
            self.acceptance.observe(k, accepted, share)
            return None
        return self.acceptance.observe_stretch(belief, k, accepted, share)


def spread(k_max: int) -> list[int]:
    """1 … k_max ordered so that consecutive picks lie far apart."""
    order: list[int] = []
    lo, hi = 1, k_max
    while lo <= hi:
        order.append(hi)
        if lo != hi:
            order.append(lo)
        lo, hi = lo + 1, hi - 1
    # Interleave halves so the middle is not visited last in a run.
    half = (len(order) + 1) // 2
    return [x for pair in itertools.zip_longest(order[:half], order[half:]) for x in pair if x]


__all__ = ["Acceptance", "DraftLength", "Ema", "expected_tokens", "spread"]
