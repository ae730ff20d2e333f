"""Auto's choice of k from a cost profile and the running acceptance."""

from __future__ import annotations

import itertools
import json
import random
import time
from dataclasses import replace
from pathlib import Path

import pytest

from app.engine import costs
from app.engine.adaptive import EVIDENCE, Acceptance, DraftLength
from app.engine.costs import (
    CostModel,
    CostProfile,
    Plan,
    ProfileStore,
    expected_tokens,
    geometric,
    plan_round,
)
from app.engine.stretch import FRESH

# One cached forward of m tokens, in ms: a 70B 4-bit target on MLX's CUDA backend
# (per-row kernel below 8 rows, one tile from 8) and on an M5 Max (5-row tiles).
CUDA_70B = (48, 86, 124, 161, 199, 236, 273, 81, 81, 84, 81, 83, 81, 81, 81, 82, 124)
METAL_M5 = (76, 80, 85, 96, 108, 128, 148, 168, 186, 205, 223, 242, 260, 279, 297, 316, 334)
# An 8B 4-bit target on the H200 (plain step 6.2 ms), whose 1B draft steps in 2.64 ms.
CUDA_8B = (6.2, 16, 20, 23, 27, 31, 36, 20, 20, 21, 19, 19, 21, 20, 21, 19, 26)


def _profile(ms: tuple[float, ...], draft_ms: float) -> CostProfile:
    return CostProfile(tuple(v / 1e3 for v in ms), draft_ms / 1e3, 512, "test", "0")


def _controller(profile: CostProfile, alpha: float, rounds: int = 60) -> DraftLength:
    """A controller that has seen ``rounds`` of 16-token drafts accepted at about ``alpha``."""
    lengths = DraftLength(16, costs=CostModel(profile=profile))
    # A run of a accepted then one rejection has per-token acceptance a / (a + 1).
    accepted = min(16, round(alpha / (1 - alpha))) if alpha < 1 else 16
    for _ in range(rounds):
        lengths.observe(16, accepted)
    return lengths


def test_expected_tokens_per_position() -> None:
    assert expected_tokens(geometric(0.0), 5) == 1.0
    assert expected_tokens(geometric(1.0), 4) == 5.0
    assert expected_tokens(geometric(0.5), 2) == pytest.approx(1.75)
    # Past the given positions the last rate carries on.
    assert expected_tokens((1.0, 0.5), 3) == pytest.approx(1 + 1 + 0.5 + 0.25)


def test_padding_picks_the_cheapest_wider_verification() -> None:
    p = _profile(CUDA_70B, 2.0)
    assert p.padded(5) == (pytest.approx(0.081), 8)  # 5 rows cost more than 8
    assert p.padded(17) == (pytest.approx(0.124), 17)
    assert p.steps(8) == pytest.approx(81 / 48)


def test_widths_within_a_kernel_build_of_each_other_share_one_shape() -> None:
    p = _profile(CUDA_70B, 2.0)
    assert p.padded(9) == (pytest.approx(0.081), 9)  # nothing built: the cheapest, narrowest
    # Widths 9-16 cost 81-84 ms: within an 80 ms build over SHAPE_ROUNDS rounds (5 ms)
    # and SHAPE_NOISE of the cost (8 ms) of each other.
    built = replace(p, build=0.080)
    assert (costs.SHAPE_ROUNDS, costs.SHAPE_NOISE) == (16, 0.1)
    assert built.padded(9) == (pytest.approx(0.082), 16)  # the widest: longer drafts fit too
    assert built.padded(9, keep=10) == (pytest.approx(0.084), 10)  # the width in use stays
    assert built.padded(13, keep=10) == (pytest.approx(0.082), 16)  # 10 rows are too few
    assert built.padded(5, keep=6) == (pytest.approx(0.082), 16)  # 6 rows cost 236 ms
    assert built.padded(17) == (pytest.approx(0.124), 17)
    # A build under a quarter of a plain step (48 ms) is noise: nothing is kept.
    assert replace(p, build=0.010).padded(9) == (pytest.approx(0.081), 9)
    # A stored profile keeps it; an older one without it builds nothing.
    assert CostProfile.from_dict(built.as_dict()) == built
    assert CostProfile.from_dict({"verify": [0.05]}).build == 0.0


def test_a_fixed_k_keeps_its_width_until_another_saves_more_than_a_build() -> None:
    profile = replace(_profile(CUDA_70B, 2.0), build=0.080)
    lengths = DraftLength(16, fixed=8, costs=CostModel(profile=profile))
    assert lengths.choose().width == 16
    for _ in range(4):  # its forwards now measure 3 ms dearer than 9 rows'
        lengths.costs.observe_verify(16, 0.084)
    assert [lengths.choose().width for _ in range(5)] == [16] * 5
    for _ in range(4):  # 19 ms dearer: more than noise, and it repays a build soon
        lengths.costs.observe_verify(16, 0.100)
    assert [lengths.choose().width for _ in range(5)] == [15] * 5
    # Tune's measurement in a process whose kernels are built sees no build; it stays.
    lengths.costs.replace(_profile(CUDA_70B, 2.0))
    assert lengths.costs.profile().build == pytest.approx(0.080)


def test_cuda_costs_draft_long_and_metal_costs_draft_short() -> None:
    sure = geometric(0.95)
    cuda = plan_round(_profile(CUDA_70B, 2.0), sure, 16)
    metal = plan_round(_profile(METAL_M5, 4.0), sure, 16)
    assert cuda is not None and metal is not None
    # One 16-row tile verifies 16 tokens for the price of 8; 17 rows cost a second tile.
    assert cuda.k == 15 and cuda.width == 16
    assert 2 <= metal.k <= 5 and metal.width == metal.k + 1
    assert cuda.rate > 2.5 / 0.048  # beyond 2.5x a plain step
    # A fixed k is padded to the cheapest width too.
    fixed = plan_round(_profile(CUDA_70B, 2.0), sure, 16, k=4)
    assert fixed is not None and (fixed.k, fixed.width) == (4, 8)


def test_plan_reason_says_what_verification_costs() -> None:
    plan = plan_round(_profile(CUDA_70B, 2.0), geometric(0.95), 16, k=8)
    assert plan is not None
    assert plan.reason == "9 tokens verify for 1.7 steps"
    padded = plan_round(_profile(CUDA_70B, 2.0), geometric(0.95), 16, k=5)
    assert padded is not None and padded.reason == "6 tokens verify for 1.7 steps (padded to 8)"
    assert Plan(0, 1).reason.startswith("drafting does not pay")


def test_auto_follows_the_profile_and_keeps_fixed_k() -> None:
    auto = _controller(_profile(CUDA_70B, 2.0), 0.95)
    plans = [auto.choose() for _ in range(100)]
    assert sorted(p.k for p in plans)[50] == 15
    fixed = DraftLength(16, fixed=3, costs=CostModel(profile=_profile(CUDA_70B, 2.0)))
    assert {(p.k, p.width) for p in (fixed.choose() for _ in range(50))} == {(3, 8)}


def test_auto_decodes_plainly_only_once_acceptance_is_measured() -> None:
    # Verification of m rows 30 + 10 m ms, a draft step of a quarter of a plain step.
    dear = _profile(tuple(30.0 + 10.0 * m for m in range(1, 18)), 10.0)
    fresh = DraftLength(16, costs=CostModel(profile=dear))
    assert fresh.choose().k > 0  # the prior alone never rules drafting out
    for _ in range(int(EVIDENCE) + 4):  # evidence fades a little each round
        fresh.observe(2, 0)
    assert fresh.choose().k == 0


def test_auto_decodes_plainly_at_once_where_no_acceptance_could_pay() -> None:
    # Verification as dear as the tokens it checks, and a draft step of half a step:
    # every draft accepted, a round still costs more than its tokens decoded plainly.
    dear = _profile(tuple(40.0 * m for m in range(1, 18)), 20.0)
    fresh = DraftLength(16, costs=CostModel(profile=dear))
    assert fresh.choose().k == 0


def test_a_dip_near_break_even_does_not_stop_drafting_for_good() -> None:
    auto = DraftLength(8, costs=CostModel(9, profile=_profile(CUDA_70B, 8.0)))
    unlucky = (0, 1, 0, 2, 1, 0)  # about 0.46 a token
    for accepted in unlucky:
        auto.observe(8, accepted)
    central = plan_round(auto.costs.profile(), auto.acceptance.rates(), 8)
    assert central is not None and central.k == 0  # on the estimate alone, plain would win
    assert auto.choose().k > 0  # but six rounds cannot tell: it drafts on
    for _ in range(12):  # many rounds say the same: plain for sure
        for accepted in unlucky:
            auto.observe(8, accepted)
    assert auto.choose().k == 0


def test_doubt_does_not_keep_auto_drafting_below_plain_for_good() -> None:
    # The 8b:1b pair at miss 0.1: stretches of 2 to 13 accepted tokens.
    auto = DraftLength(16, costs=CostModel(profile=_profile(CUDA_8B, 2.64)))
    for accepted in itertools.islice(itertools.cycle((12, 2, 13, 2, 11, 2)), 60):
        auto.observe(13, accepted)
    profile, rates = auto.costs.profile(), auto.acceptance.rates()
    step = CUDA_8B[0] / 1e3
    drafting = plan_round(profile, rates, 16, plain=False)
    assert drafting is not None and 0.9 < drafting.rate * step < 1  # a little below plain
    # Within the doubt of the acceptance's memory, which never shrinks: tries teach the rest.
    plans = [auto.choose() for _ in range(40)]
    assert all(p.explore for p in plans if p.k)
    spent = sum(p.seconds for p in plans)
    loss = sum(p.seconds * (1 - p.rate * step) for p in plans if p.k)
    assert loss <= 0.03 * spent


def _simulate(
    profile: CostProfile, overhead: float, miss: float, start: int, k: int | None
) -> float:
    """Tokens per second of a controller over four 192-token replies after two warm-up ones.

    The draft misses as the synthetic pairs' drafts do (app.testing.synthetic, seed 1): at
    fixed places of a 64-token cycle, each reply starting at ``start``. A round keeps the
    drafts before the first miss and costs its draft steps, its verification and
    ``overhead``; a plain token costs a step.
    """
    missed = set(random.Random(1).sample(range(64), round(miss * 64)))
    auto = DraftLength(16, fixed=k, costs=CostModel(profile=profile))
    step, draft = profile.step or 0.0, profile.draft_step or 0.0
    tokens = seconds = 0.0
    for reply in range(6):
        at, left, belief = start, 192, FRESH
        while left:
            plan = auto.choose(belief)
            drafts = min(plan.k, left - 1)
            if drafts == 0:
                made = 1 if plan.k else min(max(1, round(plan.tokens)), left)
                spent = made * step
                auto.costs.observe_step(step)
            else:
                width = max(plan.width, drafts + 1)
                kept = next((i for i in range(drafts) if (at + i) % 64 in missed), drafts)
                spent = drafts * draft + (profile.v(width) or 0.0) + overhead
                auto.costs.observe_round(drafts, width, spent)
                belief = auto.observe(drafts, kept, belief)
                made = min(kept + 1, left)
                if plan.explore:
                    auto.tried(made, spent)
            at, left = at + made, left - made
            if reply >= 2:
                tokens, seconds = tokens + made, seconds + spent
    return tokens / seconds


@pytest.mark.parametrize(
    ("ms", "draft_ms", "miss"),
    [(CUDA_8B, 2.64, 0.1), (CUDA_8B, 2.64, 0.28), (CUDA_70B, 2.6, 0.1), (CUDA_70B, 2.6, 0.28)],
)
def test_auto_stays_near_the_best_of_plain_and_every_fixed_k(
    ms: tuple[float, ...], draft_ms: float, miss: float
) -> None:
    # The H200's costs, a round's fixed cost beside them, and the synthetic pairs' misses:
    # 8b:1b at miss 0.1 is where drafting breaks even, 70b:1b at 0.28 where it gains 1.2-1.7x.
    profile = _profile(ms, draft_ms)
    for start in (0, 30, 50, 60):
        auto = _simulate(profile, 0.006, miss, start, None)
        best = max(
            1 / ms[0] * 1e3, *(_simulate(profile, 0.006, miss, start, k) for k in (4, 8, 13))
        )
        assert auto >= 0.95 * best, (start, auto / best)


def test_longer_drafts_are_tried_now_and_then_across_the_range() -> None:
    auto = _controller(_profile(METAL_M5, 4.0), 0.7)
    plans = [auto.choose() for _ in range(2000)]
    best = sorted(p.k for p in plans)[1000]
    tried = {p.k for p in plans if p.k > best}
    assert len(tried) >= 3 and max(tried) == 16  # far ends too, not only neighbours
    assert sum(p.k > best for p in plans) < 0.1 * len(plans)


def test_a_rounds_fixed_cost_favours_longer_drafts() -> None:
    # Metal-shaped costs where a round also pays 60 ms that no width explains.
    sure = geometric(0.9)
    lean = plan_round(_profile(METAL_M5, 4.0), sure, 16)
    heavy = plan_round(replace(_profile(METAL_M5, 4.0), overhead=0.06), sure, 16)
    assert lean is not None and heavy is not None
    assert heavy.k > lean.k
    assert heavy.seconds == pytest.approx(0.06 + heavy.k * 0.004 + METAL_M5[heavy.k] / 1e3)


def test_rounds_teach_the_fixed_cost_and_correct_a_width_fast() -> None:
    model = CostModel(profile=_profile(CUDA_70B, 2.0))
    for _ in range(30):  # k = 15 verified in 16 rows: 30 + 82 ms explained, 139 ms taken
        model.observe_round(15, 16, 0.139)
    assert model.profile().overhead == pytest.approx(0.139 - 0.030 - 0.082, abs=1e-6)
    # Beside its draft steps, a round at width 16 costs what rounds there took.
    assert model.profile().round_seconds(16) == pytest.approx(0.139 - 0.030)
    # A width no round ran at costs its forward plus the fixed cost.
    assert model.profile().round_seconds(12) == pytest.approx(0.083 + 0.027, abs=1e-6)
    # A width measured once follows the rounds at once, and a stall (a kernel
    # built, a collection) does not carry over into the rounds after it.
    model.observe_verify(17, 0.100)
    assert model.profile().v(17) == pytest.approx(0.100)
    model.observe_verify(17, 2.7)
    assert model.profile().v(17) == pytest.approx(0.124)
    model.observe_verify(17, 0.101)
    assert model.profile().v(17) == pytest.approx(0.101)
    for _ in range(3):
        model.observe_round(15, 16, 0.139 + 0.5)
    assert model.profile().overhead == pytest.approx(0.027, abs=1e-6)
    # The fixed cost survives a store and a reload.
    again = CostModel(
        profile=CostProfile.from_dict(json.loads(json.dumps(model.profile().as_dict())))
    )
    assert again.profile().overhead == pytest.approx(model.profile().overhead)


def test_one_stalled_round_does_not_rule_drafting_out() -> None:
    # On an H200 a hybrid pair's first round at a new k built kernels for 7.7 s; as
    # the only fixed-cost sample it ruled drafting out, and no try could pay it back.
    auto = _controller(_profile(CUDA_70B, 2.0), 0.999)
    auto.costs.observe_round(15, 16, 0.030 + 0.082 + 7.7)
    assert auto.costs.profile().overhead == 0.0
    assert auto.choose().k == 15
    for _ in range(2):  # a fixed cost that every round shows still counts from the next one
        auto.costs.observe_round(15, 16, 0.030 + 0.082 + 0.020)
    assert auto.costs.profile().overhead == pytest.approx(0.020, abs=1e-6)


def test_auto_leaves_a_width_whose_rounds_cost_more_than_its_forward() -> None:
    auto = _controller(_profile(CUDA_70B, 2.0), 0.999)
    assert (auto.choose().k, auto.choose().width) == (15, 16)
    for _ in range(10):  # rounds at 16 rows take 200 ms beside their drafts, at 15 rows 90
        auto.costs.observe_round(15, 16, 0.030 + 0.200)
        auto.costs.observe_round(14, 15, 0.028 + 0.090)
    plan = auto.choose()
    assert plan.width != 16 and plan.k == plan.width - 1


def test_a_widths_own_round_cost_counts_from_its_third_round() -> None:
    model = CostModel(profile=_profile(CUDA_70B, 2.0))
    model.observe_round(15, 16, 0.030 + 0.090)  # the first at a width builds kernels
    model.observe_round(15, 16, 0.030 + 0.900)  # a stall
    model.observe_round(15, 16, 0.030 + 0.090)
    # Two rounds: the forward plus the fixed cost still price the width.
    assert model.profile().rounds[15] is None
    assert model.profile().round_seconds(16) == pytest.approx(0.082 + model.profile().overhead)
    model.observe_round(15, 16, 0.030 + 0.091)
    # Three rounds count, blended with the fixed cost every round shows.
    overhead = model.profile().overhead
    blend = 0.082 + (3 * (0.091 - 0.082) + costs.ROUND_PRIOR * overhead) / (3 + costs.ROUND_PRIOR)
    assert model.profile().round_seconds(16) == pytest.approx(blend)


def test_a_few_slow_rounds_at_a_width_do_not_price_it_out_and_many_do() -> None:
    model = CostModel(profile=_profile(CUDA_70B, 2.0))
    for _ in range(20):  # rounds of k = 14 in 15 rows: 28 ms of drafts, 81 + 10 ms beside
        model.observe_round(14, 15, 0.028 + 0.091)
    fair = model.profile().round_seconds(16)
    assert fair is not None
    assert fair == pytest.approx(0.082 + 0.010, abs=1e-6)
    for _ in range(4):  # a busy spell: the first rounds at 16 rows take 60 ms more
        model.observe_round(15, 16, 0.030 + 0.092 + 0.060)
        model.observe_round(14, 15, 0.028 + 0.091)
    # Less than half of it counts: one busy spell does not steer Auto off a width.
    busy = model.profile().round_seconds(16)
    assert busy is not None and busy < fair + 0.030
    for _ in range(20):  # it stays: the width really costs more than the others
        model.observe_round(15, 16, 0.030 + 0.092 + 0.060)
    wide, narrow = model.profile().round_seconds(16), model.profile().round_seconds(15)
    assert wide is not None and narrow is not None and wide - narrow > 0.035
    # A stored profile keeps how many rounds back each width's cost.
    again = CostModel(
        profile=CostProfile.from_dict(json.loads(json.dumps(model.profile().as_dict())))
    )
    assert again.profile().round_seconds(16) == pytest.approx(model.profile().round_seconds(16))


def test_while_plain_auto_tries_its_best_draft_as_the_budget_allows() -> None:
    # Drafting just short of paying: Auto decodes plainly, and keeps checking.
    auto = DraftLength(16, costs=CostModel(profile=_profile(CUDA_70B, 6.0)))
    for i in range(40):  # half the first drafts survive, no second one
        auto.observe(16, i % 2)
    profile, rates = auto.costs.profile(), auto.acceptance.rates()
    plain, drafting = plan_round(profile, rates, 16), plan_round(profile, rates, 16, plain=False)
    assert plain is not None and plain.k == 0
    assert drafting is not None and 0 < drafting.k < 16
    plans = [auto.choose() for _ in range(60)]  # mostly plain bursts of 32 tokens
    tries = [p for p in plans if p.k]
    # Tries come every few bursts, not every 16 plans, and try what would pay best.
    assert len(tries) >= 6 and {(p.k, p.explore) for p in tries} == {(drafting.k, True)}
    spent = sum(p.seconds for p in plans)
    loss = sum(p.seconds * (1 - p.rate / plain.rate) for p in tries)
    assert loss <= 0.03 * spent


def test_a_try_that_costs_more_than_expected_delays_the_next() -> None:
    def plain_tokens_between_tries(made: int, slower: float) -> float:
        auto = DraftLength(16, costs=CostModel(profile=_profile(CUDA_70B, 6.0)))
        for i in range(40):  # half the first drafts survive: plain, with tries
            auto.observe(16, i % 2)
        while not (first := auto.choose()).k:
            pass
        auto.tried(made, first.seconds * slower)
        tokens = 0.0
        while not (plan := auto.choose()).k:
            tokens += plan.tokens
        return tokens

    expected = plain_tokens_between_tries(2, 1.0)  # about what it was expected to make
    assert expected > 0
    # One token in twice the time: its loss beyond the expected one waits out too.
    assert plain_tokens_between_tries(1, 2.0) > 2 * expected


def test_a_width_priced_up_in_a_slow_spell_is_measured_afresh_later() -> None:
    model = CostModel(profile=_profile(CUDA_70B, 2.0))
    for _ in range(10):  # a slow spell while Auto ran 16 rows: 60 ms more than now
        model.observe_round(15, 16, 0.030 + 0.092 + 0.060)
    slow = model.profile().round_seconds(16)
    assert slow is not None and slow > 0.140
    for _ in range(costs.ROUND_STALE + 1):  # then it ran 15 rows, in better times
        model.observe_round(14, 15, 0.028 + 0.091)
    # Width 16's own rounds are stale: its forward and the fixed cost price it again.
    assert model.profile().rounds[15] is None
    assert model.profile().round_seconds(16) == pytest.approx(0.082 + 0.010, abs=1e-6)
    for _ in range(4):  # back at 16 rows: the new rounds count, the slow ones no more
        model.observe_round(15, 16, 0.030 + 0.092)
    assert model.profile().rounds[15] == pytest.approx(0.092)


def test_plain_bursts_last_until_a_try_is_due_and_a_catch_up_delays_the_next() -> None:
    from app.engine.adaptive import EXPLORE_BUDGET, PLAIN_BURST_MAX

    auto = DraftLength(16, costs=CostModel(profile=_profile(CUDA_70B, 6.0)))
    for _ in range(40):  # no draft survives: a try is dear
        auto.observe(16, 0)
    plans = [auto.choose() for _ in range(40)]
    bursts, tries = [p for p in plans if p.k == 0], [p for p in plans if p.k]
    # One burst runs until the budget allows the next try, not 32 tokens at a time:
    # each burst's last step is not pipelined.
    assert tries and len(bursts) <= 2 * len(tries) + 1
    assert min(p.tokens for p in bursts) > costs.PLAIN_BURST
    plain = bursts[0].rate
    loss = sum(p.seconds * (1 - p.rate / plain) for p in tries)
    assert loss <= 1.5 * EXPLORE_BUDGET * sum(p.seconds for p in plans)
    # Catching the draft up for a try counts too: the next try waits longer.
    while not auto.choose().k:
        pass
    auto.charge(1.0)  # a second: about a thousand plain tokens
    after = [auto.choose() for _ in range(3)]
    assert [(p.k, p.tokens) for p in after] == [(0, PLAIN_BURST_MAX)] * 3


def test_tries_of_longer_drafts_are_marked_to_be_timed() -> None:
    auto = _controller(_profile(METAL_M5, 4.0), 0.7)
    plans = [auto.choose() for _ in range(400)]
    best = sorted(p.k for p in plans)[200]
    assert {p.explore for p in plans if p.k > best} == {True}
    assert not any(p.explore for p in plans if p.k <= best)


def test_unmeasured_widths_are_measured_a_round_each() -> None:
    reported: list[CostProfile] = []
    model = CostModel(widths=9, on_complete=reported.append)
    lengths = DraftLength(8, costs=model)
    widths = []
    for _ in range(40):
        plan = lengths.choose()
        assert plan.width >= plan.k + 1 >= 2
        widths.append(plan.width)
        model.observe_verify(plan.width, 0.01 + 0.001 * plan.width)
        model.observe_draft_step(0.001)
        model.observe_step(0.01)
        lengths.observe(plan.k, plan.k)
    assert set(range(2, 10)) <= set(widths)
    assert model.complete and len(reported) == 1
    assert reported[0].v(9) == pytest.approx(0.019)


def test_a_position_seldom_reached_leans_on_the_one_before() -> None:
    acceptance = Acceptance(positions=8)
    for _ in range(30):
        acceptance.observe(3, 3)  # three positions always accepted, nothing beyond seen
    rates = acceptance.rates()
    assert rates[3] >= rates[2] * 0.99  # not pulled back to the prior
    acceptance.observe(8, 3)
    assert acceptance.rates()[3] < rates[3]  # a rejection there counts


def test_the_parts_of_one_round_fade_the_table_as_one_round() -> None:
    parts, rounds = Acceptance(), Acceptance()
    for table in (parts, rounds):
        table.observe(4, 4)
    for _ in range(4):  # one round of four requests
        parts.observe(2, 0, share=0.25)
    rounds.observe(2, 0)
    d = parts.decay
    # The first round's four positions faded once; each part by the parts after it.
    assert parts.evidence == pytest.approx(4 * d + sum(d ** (j / 4) for j in range(4)))
    assert rounds.evidence == pytest.approx(4 * d + 1)


def test_profile_store_round_trip_and_versions(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    store = ProfileStore(tmp_path / "profiles.json")
    assert store.get("t", "d") is None
    profile = _profile(CUDA_70B, 2.0)
    store.put("t", "d", profile)
    assert store.get("t", "d") == profile
    assert store.get("t", None) is None
    monkeypatch.setattr(costs, "machine", lambda: ("Device(gpu, 0)", "9.9"))
    assert store.get("t", "d") is None  # another MLX: measure again
    (tmp_path / "profiles.json").write_text("{not json")
    assert store.get("t", "d") is None
    store.put("t", "d", profile)  # a broken file is replaced, not appended to
    assert json.loads((tmp_path / "profiles.json").read_text())["version"] == 1


def test_measure_profile_on_a_tiny_pair() -> None:
    from app.engine.costs import ProfileProgress, measure_profile
    from app.testing import synthetic as syn

    events = list(
        measure_profile(syn.build("tiny"), syn.build("tiny", seed=1), widths=5, context=32)
    )
    *progress, profile = events
    assert [p.done for p in progress if isinstance(p, ProfileProgress)] == [1, 2, 3, 4, 5, 6]
    assert isinstance(profile, CostProfile) and profile.complete and profile.widths == 5
    assert all(v is not None and v > 0 for v in profile.verify)
    assert profile.draft_step is not None and profile.draft_step > 0


def test_measure_profile_draft_step_ignores_one_stalled_run() -> None:
    from app.engine.costs import measure_profile
    from app.testing import synthetic as syn

    draft = syn.build("tiny", seed=1)
    steps = 0

    class Stalling(type(draft)):  # type: ignore[misc]
        """The third one-token step (the first timed one) stalls, as on a busy host."""

        def __call__(self, x, *args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal steps
            if x.shape[1] == 1:
                steps += 1
                if steps == 3:
                    time.sleep(0.4)
            return super().__call__(x, *args, **kwargs)

    draft.__class__ = Stalling
    *_, profile = list(measure_profile(syn.build("tiny"), draft, widths=2, context=32))
    assert isinstance(profile, CostProfile) and profile.draft_step is not None
    assert steps > 3  # the stall ran
    assert profile.draft_step < 0.4 / 16 / 2  # the stalled run does not count


def test_measure_profile_times_what_a_new_width_builds() -> None:
    from app.engine.costs import measure_profile
    from app.testing import synthetic as syn

    target = syn.build("tiny")
    built: set[int] = set()

    class Building(type(target)):  # type: ignore[misc]
        """The first forward of each width sleeps, as a kernel build would."""

        def __call__(self, x, *args, **kwargs):  # type: ignore[no-untyped-def]
            if x.shape[1] not in built:
                built.add(x.shape[1])
                time.sleep(0.2)
            return super().__call__(x, *args, **kwargs)

    target.__class__ = Building
    *_, profile = list(measure_profile(target, None, widths=4, context=32))
    assert isinstance(profile, CostProfile)
    assert 0.15 < profile.build < 0.4
    assert all(v is not None and v < 0.15 for v in profile.verify)


def test_measure_profile_times_a_plain_step_queued_behind_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import mlx.core as mx

    from app.engine.costs import measure_profile
    from app.testing import synthetic as syn

    target = syn.build("tiny")
    seen: list[str] = []

    class Seen(type(target)):  # type: ignore[misc]
        def __call__(self, x, *args, **kwargs):  # type: ignore[no-untyped-def]
            seen.append("forward" if x.shape[1] == 1 else "wide")
            return super().__call__(x, *args, **kwargs)

    target.__class__ = Seen
    queue = mx.async_eval

    def queued(*arrays):  # type: ignore[no-untyped-def]
        seen.append("queued")
        return queue(*arrays)

    monkeypatch.setattr(mx, "async_eval", queued)
    *_, profile = list(measure_profile(target, None, widths=3, context=64))
    assert isinstance(profile, CostProfile) and profile.complete
    # Plain decoding queues each step before the last is read; a lone forward
    # waited on would pay for building its graph as well.
    steps = "".join("q" if s == "queued" else "f" for s in seen if s != "wide")
    assert "fq" * 8 in steps


def test_the_plain_step_is_measured_afresh_after_many_drafting_rounds() -> None:
    model = CostModel(profile=_profile(CUDA_70B, 2.0))
    for _ in range(5):  # a process's first plain steps, in a slow spell
        model.observe_step(0.050)
    assert model.profile().step == pytest.approx(0.050)
    for _ in range(costs.COST_STALE + 1):  # Auto drafted since, with no probe
        model.observe_round(4, 5, 0.060)
    model.observe_step(0.030)  # a probe, in better times
    assert model.profile().step == pytest.approx(0.030)
    model.observe_round(4, 5, 0.060)
    model.observe_step(0.031)  # the next probe soon after: one median again
    assert model.profile().step == pytest.approx(0.030)
    for _ in range(costs.COST_STALE + 1):  # rounds faster than a stale draft step says
        model.observe_round(4, 5, 0.006)
    model.observe_step(0.020)  # they ran all the same: the step is stale again
    assert model.profile().step == pytest.approx(0.020)


def test_a_plain_step_is_timed_over_the_bursts_last_steps() -> None:
    pace = costs.PlainPace()
    now, seen = 0.0, []
    for i in range(40):  # ten slow steps while a spell lasts, then 27 ms steps
        now += 0.060 if i < 10 else 0.027
        seen.append(pace.token(now, behind=True))
    assert seen[:2] == [None, None]  # the first token starts the clock; one step is no pace
    assert seen[2] == pytest.approx(0.060)
    assert seen[-1] == pytest.approx(0.027)  # the slow start is past


def test_the_draft_step_is_measured_afresh_after_a_plain_stretch() -> None:
    model = CostModel(profile=_profile(CUDA_70B, 2.0))
    for _ in range(5):  # drafting in a fast spell
        model.observe_draft_step(0.002)
    assert not model.draft_stale
    for _ in range(costs.COST_STALE + 1):  # Auto decoded plainly since
        model.observe_step(0.050)
    assert model.draft_stale  # the next drafting round is timed
    model.observe_draft_step(0.004)  # in a slow spell
    assert model.profile().draft_step == pytest.approx(0.004) and not model.draft_stale
