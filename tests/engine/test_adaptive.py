import pytest

from app.engine.adaptive import DraftLength, expected_tokens


def test_expected_tokens() -> None:
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def _run(lengths: DraftLength, alpha_hits: float, cost, rounds: int = 200) -> list[int]:  # type: ignore[no-untyped-def]
    chosen = []
    for i in range(rounds):
        k = lengths.choose()
        chosen.append(k)
        # Deterministic acceptance: accept floor(alpha * k) tokens, varying a little.
        accepted = min(k, int(alpha_hits * k + (i % 2) * 0.5))
        lengths.observe(k, accepted, cost(k))
    return chosen


def test_fixed_k_is_kept() -> None:
    lengths = DraftLength(k_max=8, fixed=3)
    assert _run(lengths, 0.1, lambda k: 1.0 + k) == [3] * 200


def test_high_acceptance_and_flat_verify_cost_pick_a_long_draft() -> None:
    lengths = DraftLength(k_max=8)
    chosen = _run(lengths, 1.0, lambda k: 1.0 + 0.05 * k)
    assert sorted(chosen[-50:])[25] >= 7


def test_low_acceptance_and_costly_drafts_pick_a_short_draft() -> None:
    lengths = DraftLength(k_max=8)
    chosen = _run(lengths, 0.2, lambda k: 1.0 + 0.6 * k)
    assert sorted(chosen[-50:])[25] <= 2
    assert lengths.acceptance < 0.5


def test_choices_stay_within_bounds() -> None:
    lengths = DraftLength(k_max=3)
    chosen = _run(lengths, 0.9, lambda k: 1.0)
    assert set(chosen) <= {1, 2, 3}


def test_k_moves_one_step_past_what_was_measured() -> None:
    lengths = DraftLength(k_max=8)
    lengths.observe(4, 4, 1.0)
    lengths.observe(4, 4, 1.0)
    # Flat measured cost and full acceptance favour long drafts, but k may only
    # step to 5 until 5 has been measured.
    assert lengths.choose() == 5
