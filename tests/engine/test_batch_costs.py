"""The batch's cost model over (sequences, rows each) and the draft lengths it plans."""

from __future__ import annotations

import pytest

from app.engine.adaptive import EVIDENCE, Acceptance
from app.engine.batch_costs import (
    LEARN_EVERY,
    PROBE_EVERY,
    RETRY_STACK,
    BatchCosts,
    BatchLength,
    BatchPlan,
    BatchProfile,
    Want,
    along_stretches,
    plan_batch,
)
from app.engine.costs import CostModel, CostProfile, ProfileStore
from app.engine.stretch import FRESH

# One request: 50 ms a plain step, a line up to 16 rows, a 2 ms draft step.
SINGLE = CostProfile(verify=tuple(0.05 + 0.01 * (m - 1) for m in range(1, 18)), draft_step=0.002)


def _alone(m: int) -> float:
    return 0.05 + 0.01 * (m - 1)


def _costs(profile: BatchProfile | None = None, stack: bool = False) -> BatchCosts:
    """Costs of a draft that runs packed steps only, unless it may ``stack``."""
    costs = BatchCosts(CostModel(17, profile=SINGLE), profile)
    costs.can_stack = stack
    return costs


def _observe(costs: BatchCosts, b: int, m: int, seconds: float, times: int = 2) -> None:
    for _ in range(times):  # the first sample of a shape builds kernels and is dropped
        costs.observe_parts(b, m, m - 1, b, 0.004 * (m - 1), seconds)


def _accepting(alpha: float, rounds: int = 40, k: int = 16) -> Acceptance:
    acceptance = Acceptance()
    accepted = 0.0
    for _ in range(rounds):
        accepted += alpha * k
        n = int(accepted)
        accepted -= n
        acceptance.observe(k, min(n, k))
    return acceptance


def test_an_unmeasured_batch_costs_what_its_requests_would_one_after_another() -> None:
    costs = _costs()
    assert costs.verify(4, 3) == pytest.approx(4 * _alone(3))
    assert costs.draft_step(4) == pytest.approx(4 * 0.002)
    assert costs.verify(1, 3) == pytest.approx(_alone(3))
    assert not costs.measured(4, 3) and costs.measured(1, 3)


def test_a_sequence_count_reads_its_own_measured_widths_along_a_line() -> None:
    costs = _costs()
    _observe(costs, 4, 8, 0.10)
    _observe(costs, 4, 16, 0.14)
    assert costs.measured(4, 8) and not costs.measured(4, 12)
    assert costs.verify(4, 12) == pytest.approx(0.12)
    assert costs.verify(4, 2) == pytest.approx(0.10)  # no cheaper than the narrowest measured


def test_counts_between_measured_ones_lie_on_a_line_never_dearer_than_one_by_one() -> None:
    costs = _costs()
    _observe(costs, 2, 4, 0.10)
    _observe(costs, 8, 4, 0.16)
    assert costs.verify(4, 4) == pytest.approx(0.12)
    # Past the largest measured count the slope goes on, capped by running one at a time.
    wide = costs.verify(16, 4)
    assert wide is not None and wide <= 16 * _alone(4)
    assert wide == pytest.approx(0.16 + 0.01 * 8)


def test_a_timed_round_measures_the_draft_step_of_its_sequences() -> None:
    costs = _costs()
    for _ in range(2):
        costs.observe_parts(4, 5, 4, 4, draft=0.02, verify=0.1)
    assert costs.draft_step(4) == pytest.approx(0.005)
    assert costs.draft_step(2) == pytest.approx(0.002 + (0.005 - 0.002) / 3)


def test_overhead_is_what_rounds_take_beyond_their_parts_and_stalls_are_left_out() -> None:
    costs = _costs()
    _observe(costs, 2, 5, 0.1)
    work = costs.round_seconds(2, 5, 4, 2)
    assert work is not None
    for _ in range(4):
        costs.observe_round(2, 5, 4, 2, work + 0.01)
    costs.observe_round(2, 5, 4, 2, work * 5)  # the thread served something else meanwhile
    assert costs.overhead(2) == pytest.approx(0.01)
    assert costs.round_seconds(2, 5, 4, 2) == pytest.approx(work + 0.01)


def test_the_batch_drafts_long_where_its_wide_forwards_cost_little() -> None:
    flat = BatchProfile(verify=((4, (0.1,) * 17),), draft=((4, 0.003),))
    wants = [Want(_accepting(1.0), room=16) for _ in range(4)]
    plan = plan_batch(_costs(flat), wants)
    assert plan is not None and plan.ks == (16,) * 4


def test_the_batch_drafts_less_where_each_row_costs_a_step() -> None:
    # A forward's every row costs as much as a plain step: drafting cannot pay.
    steep = BatchProfile(verify=((4, tuple(0.2 * m for m in range(1, 18))),), draft=((4, 0.01),))
    acceptance = _accepting(0.6)
    assert acceptance.evidence >= EVIDENCE
    wants = [Want(acceptance, room=16) for _ in range(4)]
    plan = plan_batch(_costs(steep), wants)
    assert plan is not None and plan.ks == (0,) * 4


def test_rooms_cap_each_request_and_a_fixed_request_keeps_its_own_k() -> None:
    flat = BatchProfile(verify=((3, (0.1,) * 17),), draft=((3, 0.003),))
    acceptance = _accepting(1.0)
    wants = [Want(acceptance, room=16), Want(acceptance, room=5), Want(acceptance, 16, fixed=2)]
    plan = plan_batch(_costs(flat), wants)
    assert plan is not None and plan.ks == (16, 5, 2)


def test_the_prior_alone_never_rules_drafting_out() -> None:
    steep = BatchProfile(verify=((2, tuple(0.2 * m for m in range(1, 18))),), draft=((2, 0.01),))
    fresh = Acceptance()  # nothing observed: the prior
    plan = BatchLength(_costs(steep)).choose([Want(fresh, 8), Want(fresh, 8)])
    assert all(plan.ks)


def test_an_unmeasured_shape_is_timed_and_a_measured_one_now_and_then() -> None:
    flat = BatchProfile(verify=((2, (0.1,) * 17),), draft=((2, 0.003),), stacked=((2, 0.002),))
    planner = BatchLength(_costs(flat, stack=True), explore_every=1000)
    acceptance = _accepting(0.95)
    timed = [planner.choose([Want(acceptance, 8), Want(acceptance, 8)]).timed for _ in range(16)]
    assert timed.count(True) == 16 // PROBE_EVERY
    fresh = BatchLength(_costs(), explore_every=1000)
    assert fresh.choose([Want(acceptance, 8), Want(acceptance, 8)]).timed


def test_now_and_then_auto_tries_a_longer_draft() -> None:
    line = tuple(0.05 + 0.01 * (m - 1) for m in range(1, 18))
    planner = BatchLength(_costs(BatchProfile(((2, line),), ((2, 0.01),))), explore_every=4)
    acceptance = _accepting(0.7)
    plans = [planner.choose([Want(acceptance, 12), Want(acceptance, 12)]) for _ in range(8)]
    usual = max(p.ks[0] for p in plans if not p.explore)
    tries = [p for p in plans if p.explore]
    assert len(tries) == 2 and all(p.ks[0] > usual and p.timed for p in tries)


def test_a_profile_survives_the_store_beside_the_single_profile(tmp_path) -> None:
    store = ProfileStore(tmp_path / "profiles.json")
    store.put("t", "d", SINGLE)
    costs = BatchCosts(
        CostModel(17, profile=SINGLE),
        on_measured=lambda p: store.put_entry("t", "d", p.as_dict(), kind="batch"),
    )
    _observe(costs, 4, 8, 0.1)
    raw = store.entry("t", "d", kind="batch")
    assert raw is not None
    again = BatchCosts(CostModel(17, profile=SINGLE), BatchProfile.from_dict(raw))
    assert again.measured(4, 8) and again.verify(4, 8) == pytest.approx(0.1)
    assert store.get("t", "d") == SINGLE  # the single profile is untouched
    assert "100.0" in again.profile().table()  # 4 sequences of 8 rows: 100 ms


def test_a_count_runs_the_grid_of_shapes_before_it_trusts_its_guesses() -> None:
    wide = BatchProfile(verify=((2, (None,) * 15 + (0.1, 0.1)),), draft=((2, 0.003),))
    planner = BatchLength(_costs(wide), explore_every=1000)
    acceptance = _accepting(1.0)
    plans = [
        planner.choose([Want(acceptance, 15), Want(acceptance, 15)]) for _ in range(LEARN_EVERY)
    ]
    assert [p.ks[0] for p in plans[:-1]] == [15] * (LEARN_EVERY - 1)  # the best known
    assert plans[-1].explore and plans[-1].timed and plans[-1].ks[0] == 7  # the nearest of the grid


def test_a_shape_that_could_not_win_even_at_half_its_guess_is_never_tried() -> None:
    row = (None,) * 7 + (0.06,) + (None,) * 7 + (0.06, None)  # 8 and 16 rows measured
    planner = BatchLength(_costs(BatchProfile(((2, row),), ((2, 1e-4),))), explore_every=1000)
    acceptance = _accepting(1.0)
    plans = [planner.choose([Want(acceptance, 15), Want(acceptance, 15)]) for _ in range(16)]
    assert not any(p.explore for p in plans)  # 1 or 3 drafts: half the tokens at best
    assert {p.ks for p in plans} == {(15, 15)}


def test_the_first_draft_step_prices_its_catch_up_apart_from_the_steps() -> None:
    costs = _costs()
    for _ in range(2):  # the first step fed the draft what the last round committed
        costs.observe_parts(4, 6, 5, 4, draft=0.07, verify=0.1, first=0.03)
    assert costs.draft_step(4) == pytest.approx(0.01)
    assert costs.catchup(4) == pytest.approx(0.02)
    # A long draft is not charged the catch-up once per step.
    assert costs.round_seconds(4, 16, 15, 4) == pytest.approx(0.02 + 15 * 0.01 + 0.1)
    again = _costs(costs.profile())
    assert again.catchup(4) == pytest.approx(0.02)


def test_one_slow_round_does_not_price_a_width_out_until_more_agree() -> None:
    costs = _costs()
    for m in (4, 8):
        _observe(costs, 4, m, 0.1, times=4)  # three counted samples each: settled
    _observe(costs, 4, 5, 0.3)  # one counted sample, three times its neighbours
    assert costs.verify(4, 5) == pytest.approx(0.1)  # no dearer than the line through the rest
    assert costs.wants_timing(4, 5, 4)  # so it is chosen, timed and measured again
    _observe(costs, 4, 5, 0.3, times=2)
    assert costs.verify(4, 5) == pytest.approx(0.3)  # three agree: it stands
    assert not costs.wants_timing(4, 5, 4)


def test_each_draft_layout_is_measured_on_the_rounds_and_the_cheaper_runs() -> None:
    costs = _costs(stack=True)
    assert not costs.stacks(1)  # one sequence has nothing to stack
    assert costs.stacks(4)  # stacked first
    for _ in range(2):
        costs.observe_parts(4, 5, 4, 4, draft=0.024, verify=0.1, first=0.006, stacked=True)
    assert not costs.stacks(4)  # then packed, priced as before until it is measured
    assert costs.draft_step(4) == pytest.approx(4 * 0.002)
    for _ in range(2):
        costs.observe_parts(4, 5, 4, 4, draft=0.040, verify=0.1, first=0.010)
    assert costs.stacks(4) and costs.draft_step(4) == pytest.approx(0.006)
    assert costs.catchup(4) == pytest.approx(0.0)
    again = BatchCosts(CostModel(17, profile=SINGLE), costs.profile())
    assert again.stacks(4) and again.draft_step(4) == pytest.approx(0.006)
    assert "stacked, ms: 4: 6.0" in again.profile().table()
    again.can_stack = False  # a draft that cannot stack runs and prices packed steps only
    assert not again.stacks(4) and again.draft_step(4) == pytest.approx(0.010)


def test_a_count_too_ragged_to_stack_runs_packed_for_a_while_then_tries_again() -> None:
    costs = _costs(stack=True)
    assert costs.stacks(4)
    costs.unstackable(4)
    assert not costs.stacks(4) and costs.stacks(3)  # other counts are their own
    assert costs.wants_timing(4, 5, 4)  # packed is not measured either
    for _ in range(4):  # the shape settles, and the packed step is measured
        costs.observe_parts(4, 5, 4, 4, draft=0.04, verify=0.1, first=0.01)
    assert not costs.wants_timing(4, 5, 4)  # priced and timed as packed meanwhile
    assert costs.draft_step(4) == pytest.approx(0.01)
    for _ in range(RETRY_STACK - 4):
        costs.observe_round(4, 5, 4, 4, 0.2)
    assert not costs.stacks(4)
    costs.observe_round(4, 5, 4, 4, 0.2)
    assert costs.stacks(4)  # stacked again: its step is still to be measured


def test_a_one_step_round_takes_the_catch_up_off_its_count_s_line() -> None:
    costs = _costs()
    for d in (2, 8):  # catch-ups of 10 and 40 ms, steps of 5 ms
        first = 0.005 * d + 0.005
        for _ in range(2):
            costs.observe_parts(d, 5, 4, d, draft=first + 3 * 0.005, verify=0.1, first=first)
    for _ in range(2):  # one step of 4 sequences: its catch-up lies between 2's and 8's
        costs.observe_parts(4, 2, 1, 4, draft=0.03, verify=0.1)
    assert costs.catchup(4) == pytest.approx(0.02)
    assert costs.draft_step(4) == pytest.approx(0.01)


# Where the synthetic draft misses in its 64-token cycle at a miss rate of 0.1.
MISSES = frozenset({4, 17, 36, 48, 51, 54})
# 8 sequences as on the H200's 8B (run 23): a forward costs little more for more
# rows, a stacked draft step 5.8 ms.
EIGHT = BatchProfile(
    verify=((8, tuple(0.028 if m <= 9 else 0.032 for m in range(1, 18))),), draft=((8, 0.0058),)
)


def _on_the_cycle(stretch: bool = True, fixed: int | None = None, rounds: int = 200) -> float:
    """Tokens per second of 8 requests on the miss pattern, after 50 rounds to learn.

    They walk it in two lockstep groups of four, as the bench's streams do.
    """
    costs = _costs(EIGHT)
    planner = BatchLength(costs)
    planner.stretch = stretch
    acceptance = Acceptance()
    place, belief = [0] * 4 + [23] * 4, [FRESH] * 8
    tokens, seconds = 0, 0.0
    for i in range(rounds):
        plan = planner.choose([Want(acceptance, 15) for _ in range(8)])
        ks = [fixed] * 8 if fixed is not None else list(plan.ks)
        for s, k in enumerate(ks):
            n = next((j for j in range(k) if (place[s] + j) % 64 in MISSES), k)
            belief[s] = acceptance.observe_stretch(belief[s], k, n, 1 / 8)
            place[s] += n + 1
            tokens += (n + 1) * (i >= 50)
        price = costs.round_seconds(8, max(ks) + 1, max(ks), 8)
        assert price is not None
        seconds += price * (i >= 50)
    return tokens / seconds


def test_batched_auto_plays_the_k_its_stretches_pay_for() -> None:
    # Per position, far drafts are learned only from tries that start mid-stretch.
    along, pooled = _on_the_cycle(), _on_the_cycle(stretch=False)
    assert along > 1.01 * pooled
    assert along >= max(_on_the_cycle(fixed=k) for k in (3, 5, 7, 9, 11, 13, 15))


def test_the_stretch_table_leaves_plans_it_cannot_better() -> None:
    flat = BatchProfile(verify=((2, (0.1,) * 17),), draft=((2, 0.003),))
    costs, plain = _costs(flat), BatchPlan((0, 0))
    one, other = _accepting(0.9), _accepting(0.9)
    assert along_stretches(costs, [Want(one, 15), Want(one, 15)], plain) is plain
    mixed = [Want(one, 15), Want(other, 15)]
    short = BatchPlan((3, 3))
    assert along_stretches(costs, mixed, short) is short  # two sources of acceptance
    fixed = [Want(one, 15, fixed=3), Want(one, 15, fixed=3)]
    assert along_stretches(costs, fixed, short) is short  # no Auto request
