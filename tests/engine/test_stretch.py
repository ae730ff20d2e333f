"""Acceptance along stretches, the stretch policy, and Auto playing it."""

from __future__ import annotations

import copy
import random

import pytest

from app.engine.adaptive import Acceptance, DraftLength
from app.engine.costs import CostModel, CostProfile
from app.engine.stretch import FRESH, Belief, StretchTable, best_policy
from app.testing import synthetic as syn

# A 32B-shaped target on the H200 (run 10, seconds): one tile from 8 rows.
VERIFY = tuple(ms / 1e3 for ms in (26.0, 45.3, 63.0, 81.2, 98.0, 114.0, 130.8, *[54.0] * 9))
DRAFT_STEP = 0.0044


def test_a_rejection_starts_a_stretch_and_a_full_acceptance_splits_the_belief() -> None:
    table = StretchTable(12)
    assert table.observe(FRESH, 4, 2, alpha=0.8) == FRESH
    on = table.rates(0.8)[4]
    after = dict(table.observe(FRESH, 4, 4, alpha=0.8))
    # The bonus token fell at distance 4: the stretch goes on from 5, or ended there.
    assert set(after) == {0, 5}
    assert after[5] == pytest.approx(on)
    assert sum(after.values()) == pytest.approx(1.0)


def test_the_rate_at_a_distance_follows_where_stretches_end() -> None:
    table = StretchTable(12, decay=1.0)
    for _ in range(30):  # every stretch ends after 3 accepted drafts
        table.observe(FRESH, 6, 3, alpha=0.8)
    rates = table.rates(0.8)
    assert min(rates[:3]) > 0.9
    assert rates[3] < 0.15


def test_the_policy_drafts_to_the_end_of_a_stretch_after_a_rejection() -> None:
    # Stretches of exactly 5: a draft of 5 takes the miss into its bonus token.
    rates = [0.999] * 5 + [0.001] * 27  # past the end, as the table leans: on the end
    seconds = [0.0] + [k * DRAFT_STEP + 0.054 for k in range(1, 16)]
    policy = best_policy(rates, seconds, 15)
    assert policy.after_miss == 5
    assert policy.k(FRESH) == 5
    assert policy.rate == pytest.approx(6 / seconds[5], rel=0.01)
    assert policy.rate > policy.same[4] and policy.rate > policy.same[6]


def _auto(belief_kept: bool, misses: set[int], replies: int = 4, reply: int = 192) -> float:
    """Tokens per second of Auto on the synthetic draft's misses (cycle of 64)."""
    profile = CostProfile(verify=VERIFY, draft_step=DRAFT_STEP)
    auto = DraftLength(15, costs=CostModel(16, profile=profile), acceptance=Acceptance())
    tokens, seconds = 0, 0.0
    for r in range(replies):
        belief: Belief | None = FRESH if belief_kept else None
        pos = done = 0
        while done < reply:
            plan = auto.choose(belief)
            assert plan.k > 0  # drafting pays on these costs
            k = min(plan.k, reply - done)
            accepted = 0
            while accepted < k and (pos + accepted + r) % 64 not in misses:
                accepted += 1
            belief = auto.observe(k, accepted, belief)
            cost = k * DRAFT_STEP + VERIFY[plan.width - 1]
            auto.costs.observe_round(k, plan.width, cost)
            pos, done, seconds = pos + accepted + 1, done + accepted + 1, seconds + cost
        tokens += done
    return tokens / seconds


def test_auto_along_stretches_beats_auto_that_plans_every_round_alike() -> None:
    misses = set(random.Random(1).sample(range(64), round(0.1 * 64)))  # as syn.build(seed=1)
    assert syn.cycle_length("0.5b") == 64
    pooled = _auto(False, misses)
    along = _auto(True, misses)
    assert along > 1.02 * pooled


def test_where_rounds_start_alike_auto_keeps_its_k() -> None:
    rnd = random.Random(0)
    acceptance = Acceptance()
    auto = DraftLength(15, costs=CostModel(16, CostProfile(verify=VERIFY, draft_step=DRAFT_STEP)))
    auto.acceptance = acceptance
    belief: Belief = FRESH
    for _ in range(200):  # i.i.d. acceptance of 0.8: the start does not matter
        k = auto.choose(belief).k
        accepted = next((i for i in range(k) if rnd.random() > 0.8), k)
        belief = auto.observe(k, accepted, belief)
    twin = copy.deepcopy(auto)
    assert auto.choose(belief).k == twin.choose(None).k


def test_a_part_of_a_round_fades_the_table_by_its_share_of_the_decay() -> None:
    parted, quarter = StretchTable(8, decay=0.98), StretchTable(8, decay=0.98**0.25)
    a = b = FRESH
    for k, n in [(4, 4), (2, 0), (3, 1), (4, 2), (5, 5)]:
        a = parted.observe(a, k, n, 0.7, share=0.25)
        b = quarter.observe(b, k, n, 0.7)
    assert a == b
    assert parted.rates(0.7) == pytest.approx(quarter.rates(0.7))
    assert parted.rates(0.7) != pytest.approx(StretchTable(8).rates(0.7))  # it learned
