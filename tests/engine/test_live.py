import dataclasses

import pytest

from app.engine.live import LiveSnapshot, LiveStats
from app.engine.types import RoundStat, Stats


def _round(k: int, accepted: int, **kw: object) -> RoundStat:
    """A round that committed its accepted tokens plus the target's own."""
    return RoundStat(tokens=accepted + 1, k=k, accepted=accepted, **kw)  # type: ignore[arg-type]


def test_fresh_stats_are_empty() -> None:
    snap = LiveStats(max_positions=3).snapshot()
    assert snap == LiveSnapshot(position_acceptance=(None, None, None))
    assert snap.empty
    assert snap.lookup_share is None


def test_rolling_window_keeps_the_last_drafting_rounds() -> None:
    live = LiveStats(window=2)
    live.add([_round(4, 4), _round(4, 2), _round(4, 0)])
    snap = live.snapshot()
    assert snap.rolling_acceptance == 2 / 8  # the first round fell out of the window
    assert snap.message_acceptance == 6 / 12
    assert snap.lifetime_acceptance == 6 / 12
    # A plain step is no drafting round: it leaves the acceptance window alone.
    live.add([RoundStat(tokens=1, k=0, accepted=0)])
    assert live.snapshot().rolling_acceptance == 2 / 8


def test_speed_covers_every_round_of_the_message_of_any_kind() -> None:
    live = LiveStats(window=2)  # the acceptance window does not bound the speed
    live.add(
        [
            RoundStat(tokens=10, k=4, accepted=4, seconds=10.0),
            RoundStat(tokens=3, k=4, accepted=2, seconds=1.0),
            RoundStat(tokens=1, k=0, accepted=0, seconds=1.0),
        ]
    )
    snap = live.snapshot()
    assert snap.tps == 14 / 12.0
    assert snap.tokens == 14
    assert snap.rounds == 3
    assert snap.drafted == 8 and snap.accepted == 6


def test_speed_is_the_messages_own_not_the_last_replys() -> None:
    live = LiveStats()
    live.add([RoundStat(tokens=8, k=8, accepted=7, seconds=1.0)], baseline_tps=4.0)
    live.begin_message()
    snap = live.snapshot()
    assert (snap.tps, snap.speedup) == (None, None)  # nothing of this reply is timed yet
    live.add([RoundStat(tokens=2, k=8, accepted=1, seconds=1.0)] * 8)
    snap = live.snapshot()
    assert snap.tps == 2.0 and snap.speedup == 0.5


def test_finish_message_puts_the_final_figures_in_place_of_the_live_ones() -> None:
    live = LiveStats()
    live.set_lifetime(accepted=10, drafted=20)
    live.add([RoundStat(tokens=4, k=4, accepted=3, seconds=0.5)] * 3, baseline_tps=4.0)
    assert live.snapshot().tps == 8.0
    # The engine's count: a last round cut at the end of text, and time that is not decoding.
    final = Stats(
        tokens=12,
        drafted=16,
        accepted=10,
        draft_seconds=0.3,
        verify_seconds=1.5,
        generation_seconds=6.0,
        baseline_tps=4.0,
    )
    live.finish_message(final)
    snap = live.snapshot()
    assert snap.tps == final.generation_tps == 12 / 1.8
    assert snap.speedup == final.speedup
    assert snap.message_acceptance == final.acceptance == 10 / 16
    assert snap.lifetime_acceptance == 20 / 36  # the message counted once, as finished
    assert snap.rounds == 3  # the rounds seen are still the rounds seen


def test_server_wide_counters_leave_the_messages_acceptance_alone() -> None:
    live = LiveStats()
    live.add([RoundStat(tokens=3, k=4, accepted=2, seconds=1.0)])
    live.finish_message(
        Stats(tokens=3, drafted=400, accepted=100, generation_seconds=1.5, stats_scope="server")
    )
    snap = live.snapshot()
    assert snap.message_acceptance == 0.5 and snap.lifetime_acceptance == 0.5
    assert snap.tps == 2.0  # a remote reply's speed is its generation time's


def test_no_time_means_no_speed() -> None:
    live = LiveStats()
    live.add([_round(4, 3)], baseline_tps=5.0)
    snap = live.snapshot()
    assert snap.tps is None
    assert snap.speedup is None
    assert not snap.empty  # acceptance is known


def test_plain_steps_count_for_speed_but_not_acceptance() -> None:
    live = LiveStats(max_positions=2)
    live.add([RoundStat(tokens=1, k=0, accepted=0, seconds=0.25)] * 3)
    snap = live.snapshot()
    assert snap.rolling_acceptance is None
    assert snap.message_acceptance is None
    assert snap.lifetime_acceptance is None
    assert snap.tps == 3 / 0.75
    assert snap.k == 0
    assert snap.position_acceptance == (None, None)
    assert (snap.rounds, snap.tokens) == (3, 3)
    assert not snap.empty


def test_message_resets_but_window_and_lifetime_carry_on() -> None:
    live = LiveStats()
    live.set_lifetime(accepted=60, drafted=100)
    live.add([_round(5, 5, seconds=1.0, lookup=2)])
    assert live.snapshot().lifetime_acceptance == 65 / 105
    live.begin_message()
    snap = live.snapshot()
    assert snap.message_acceptance is None
    assert (snap.rounds, snap.tokens, snap.draft_accepted, snap.lookup_accepted) == (0, 0, 0, 0)
    assert snap.position_acceptance == (None,) * 12
    assert snap.rolling_acceptance == 1.0
    assert snap.lifetime_acceptance == 65 / 105
    assert snap.tps is None  # speed is the new message's
    assert snap.k == 5
    live.add([_round(5, 0)])
    snap = live.snapshot()
    assert snap.message_acceptance == 0.0
    assert snap.rolling_acceptance == 5 / 10
    assert snap.lifetime_acceptance == 65 / 110


def test_set_lifetime_replaces_the_totals() -> None:
    live = LiveStats()
    live.set_lifetime(accepted=60, drafted=100)
    live.add([_round(10, 10)])
    # Re-seeding from the store, which now holds that message, counts it once.
    live.set_lifetime(accepted=70, drafted=110)
    assert live.snapshot().lifetime_acceptance == 70 / 110
    live.set_lifetime(accepted=0, drafted=0)
    assert live.snapshot().lifetime_acceptance is None


def test_reset_pair_clears_everything() -> None:
    live = LiveStats(max_positions=4)
    live.set_lifetime(accepted=5, drafted=10)
    live.add([_round(4, 2, seconds=1.0, auto=True)], baseline_tps=2.0)
    live.reset_pair()
    assert live.snapshot() == LiveSnapshot(position_acceptance=(None,) * 4)


def test_position_survival() -> None:
    live = LiveStats(max_positions=6)
    live.add([_round(3, 3), _round(3, 1), _round(2, 0), _round(5, 4)])
    pos = live.snapshot().position_acceptance
    assert len(pos) == 6
    assert pos[0] == 3 / 4  # all four proposed a first token; three kept it
    assert pos[1] == 2 / 4
    assert pos[2] == pytest.approx(2 / 3)  # the k=2 round never reached position 3
    assert pos[3] == 1.0
    assert pos[4] == 0.0
    assert pos[5] is None


def test_positions_past_the_limit_are_dropped() -> None:
    live = LiveStats(max_positions=2)
    live.add([_round(5, 5), _round(5, 1)])
    assert live.snapshot().position_acceptance == (1.0, 0.5)


def test_source_mix() -> None:
    live = LiveStats()
    live.add([_round(4, 3, lookup=1), _round(4, 4, lookup=4), _round(2, 0)])
    snap = live.snapshot()
    assert (snap.draft_accepted, snap.lookup_accepted) == (2, 5)
    assert snap.lookup_share == 5 / 7


def test_speedup_needs_a_baseline() -> None:
    live = LiveStats()
    live.add([RoundStat(tokens=16, k=15, accepted=15, seconds=2.0)])
    snap = live.snapshot()
    assert snap.tps == 8.0
    assert snap.baseline_tps is None
    assert snap.speedup is None
    live.add([RoundStat(tokens=2, k=5, accepted=1, seconds=0.0)], baseline_tps=2.0)
    assert live.snapshot().speedup == (18 / 2.0) / 2.0
    # Later rounds without a baseline keep the one measured.
    live.add([RoundStat(tokens=2, k=5, accepted=1, seconds=2.0)])
    snap = live.snapshot()
    assert snap.baseline_tps == 2.0
    assert snap.speedup == (20 / 4.0) / 2.0


def test_a_reply_too_short_to_time_shows_no_speedup() -> None:
    live = LiveStats()
    live.add([RoundStat(tokens=2, k=5, accepted=1, seconds=1.0)], baseline_tps=4.0)
    assert live.snapshot().speedup is None  # "OK" read as 0.52x plain before
    live.add([RoundStat(tokens=14, k=5, accepted=5, seconds=1.0)])
    assert live.snapshot().speedup == (16 / 2.0) / 4.0


def test_k_and_auto_follow_the_last_round() -> None:
    live = LiveStats()
    live.add([_round(5, 2, auto=True)])
    snap = live.snapshot()
    assert (snap.k, snap.auto) == (5, True)
    live.add([_round(3, 3)])
    snap = live.snapshot()
    assert (snap.k, snap.auto) == (3, False)


def test_malformed_rounds_are_clamped() -> None:
    live = LiveStats(max_positions=3)
    live.add([RoundStat(tokens=3, k=2, accepted=5, lookup=9)])
    snap = live.snapshot()
    assert snap.message_acceptance == 1.0
    assert (snap.draft_accepted, snap.lookup_accepted) == (0, 2)
    assert snap.position_acceptance == (1.0, 1.0, None)


def test_snapshots_are_frozen_values() -> None:
    live = LiveStats()
    live.add([_round(4, 4)])
    snap = live.snapshot()
    live.add([_round(4, 0)])
    assert snap.message_acceptance == 1.0  # unchanged by later rounds
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.k = 1  # type: ignore[misc]


@pytest.mark.parametrize(("window", "positions"), [(0, 12), (32, 0)])
def test_bad_sizes_are_refused(window: int, positions: int) -> None:
    with pytest.raises(ValueError):
        LiveStats(window=window, max_positions=positions)


def test_subscribers_hear_every_change_as_a_snapshot() -> None:
    live = LiveStats()
    heard: list[LiveSnapshot] = []
    live.subscribe(heard.append)  # told the figures now
    live.set_lifetime(6, 8)
    live.begin_message()
    live.add([RoundStat(tokens=3, k=2, accepted=2, seconds=0.1)])
    live.finish_message(Stats(tokens=3, drafted=2, accepted=2, generation_seconds=0.1))
    live.reset_pair()
    assert len(heard) == 6
    assert heard[0].lifetime_acceptance is None and heard[1].lifetime_acceptance == 0.75
    assert heard[2].message_acceptance is None  # a new message: nothing drafted yet
    assert heard[3].message_acceptance == 1.0 and heard[4].message_acceptance == 1.0
    assert heard[-1] == live.snapshot() and heard[-1].lifetime_acceptance is None
