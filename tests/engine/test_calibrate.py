from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from app.engine import load_pair
from app.engine.calibrate import (
    CalibrationPoint,
    CalibrationProgress,
    CalibrationResult,
    calibrate,
    default_prompts,
    load_json,
    pick_best,
    prompt_set,
    recent_prompts,
    save_json,
)
from tests.conftest import TinyModels

PROMPTS = ["Write a haiku about the sea.", "def add(a, b):"]
KS: list[int | None] = [0, 1, 2, None]


@pytest.fixture(scope="module")
def pair(tiny: TinyModels):
    # Its own pair: a sweep leaves the decoder's caches and controllers changed.
    return load_pair(tiny.target, tiny.copy)


@pytest.fixture(scope="module")
def sweep(pair) -> list[CalibrationProgress | CalibrationResult]:
    return list(calibrate(pair, PROMPTS, KS, max_tokens=12))


def test_sweep_reports_progress_then_one_result(sweep) -> None:
    *progress, result = sweep
    assert all(isinstance(p, CalibrationProgress) for p in progress)
    assert isinstance(result, CalibrationResult)
    measuring = [p for p in progress if p.text.startswith("measuring costs")]
    # The costs first, one line per verification width (1 … k_max + 1) and the draft step.
    assert len(measuring) == max(k for k in KS if k) + 2
    assert progress[: len(measuring)] == measuring
    warmup, *runs = progress[len(measuring) :]
    assert warmup.text == "warming up" and warmup.done == 0
    assert len(runs) == len(KS) * len(PROMPTS)
    assert [p.done for p in runs] == list(range(len(runs)))
    assert {p.total for p in progress} == {len(runs)}
    assert runs[0].text == "k = 0, prompt 1 of 2"
    assert runs[-1].text == "k = auto, prompt 2 of 2"


def test_one_point_per_k_with_full_acceptance_for_the_copy(sweep) -> None:
    result = sweep[-1]
    assert [p.k for p in result.points] == KS
    plain, *drafting, auto = result.points
    assert plain.acceptance is None and plain.mean_k is None
    # The copy costs what the target costs, so drafting cannot pay and Auto
    # may decode plainly; whatever it drafts is accepted.
    assert auto.acceptance in (None, 1.0)
    for point in drafting:
        assert point.acceptance == 1.0
        assert point.mean_k is not None and point.mean_k >= 1
    assert result.point(1).mean_k == 1.0
    assert result.point(2).mean_k == 2.0
    # Greedy decoding is lossless: every k produces the same tokens.
    assert len({p.tokens for p in result.points}) == 1
    assert all(p.tps > 0 and p.seconds > 0 for p in result.points)
    assert result.prompts == 2 and result.max_tokens == 12
    assert result.baseline_tps == plain.tps
    assert result.pair == "tiny-llama + tiny-copy"


def test_best_k_is_the_fastest_fixed_k(sweep) -> None:
    result = sweep[-1]
    fixed = [p for p in result.points if p.k is not None]
    fastest = max(p.tps for p in fixed)
    assert result.best_k == min(p.k for p in fixed if p.tps == fastest)
    assert isinstance(result.best_k, int)
    assert result.best.k == result.best_k


def test_pick_best_breaks_ties_towards_the_smaller_k() -> None:
    def pt(k: int | None, tps: float) -> CalibrationPoint:
        return CalibrationPoint(k, tps, None, None, 10, 1.0)

    assert pick_best([pt(0, 10), pt(4, 30), pt(2, 30), pt(None, 99)]) == 2
    assert pick_best([pt(3, 5), pt(0, 5)]) == 0
    with pytest.raises(ValueError):
        pick_best([pt(None, 1)])


def test_json_round_trips(sweep, tmp_path: Path) -> None:
    result = sweep[-1]
    path = tmp_path / "sub" / "calibration.json"
    save_json(result, path)
    data = json.loads(path.read_text())
    assert data["best_k"] == result.best_k
    assert [p["label"] for p in data["points"]] == ["0", "1", "2", "auto"]
    assert data["points"][0]["speedup"] == pytest.approx(1.0)
    assert load_json(path) == result
    assert [p.name for p in path.parent.iterdir()] == ["calibration.json"]  # no temp left


def test_cancel_mid_way_yields_no_result(pair) -> None:
    cancel = threading.Event()
    events = []
    for event in calibrate(pair, PROMPTS, KS, max_tokens=12, cancel=cancel):
        events.append(event)
        if isinstance(event, CalibrationProgress) and event.done == 3:
            cancel.set()
    assert events and all(isinstance(e, CalibrationProgress) for e in events)
    last = events[-1]
    assert isinstance(last, CalibrationProgress) and last.done == 3  # nothing after it


def test_cancel_before_start_yields_nothing(pair) -> None:
    cancel = threading.Event()
    cancel.set()
    assert list(calibrate(pair, PROMPTS, KS, cancel=cancel)) == []


def test_bad_input_is_refused_at_once(pair, tiny: TinyModels) -> None:
    with pytest.raises(ValueError, match="prompt"):
        calibrate(pair, [], KS)
    with pytest.raises(ValueError, match="prompt"):
        calibrate(pair, ["  "], KS)
    with pytest.raises(ValueError, match="draft length"):
        calibrate(pair, PROMPTS, [])
    with pytest.raises(ValueError, match="fixed"):
        calibrate(pair, PROMPTS, [None])
    with pytest.raises(ValueError, match="negative"):
        calibrate(pair, PROMPTS, [0, -1])
    with pytest.raises(ValueError, match="draft model"):
        calibrate(load_pair(tiny.target), PROMPTS, KS)


def test_recent_prompts_are_distinct_non_blank_and_the_latest() -> None:
    recent = ["a", " ", "b", "a", "c", "d ", "", "e", "f"]
    assert recent_prompts(recent, limit=3) == ["d", "e", "f"]
    assert recent_prompts(["a", "b", "a"], limit=5) == ["b", "a"]


def test_prompt_set_falls_back_to_the_built_in_set() -> None:
    assert prompt_set(["x", "y", "x", "z"], limit=5) == ["y", "x", "z"]
    builtin = default_prompts()
    assert len(builtin) >= 2
    assert prompt_set(["only one", "only one", " "]) == builtin[:5]
    assert prompt_set([], limit=2) == builtin[:2]


def test_progress_within_runs_counts_tokens_and_estimates_the_time_left(pair) -> None:
    events = list(calibrate(pair, PROMPTS[:1], [0, 2], max_tokens=12, progress_every=0.0))
    within = [e for e in events if isinstance(e, CalibrationProgress) and e.run_done]
    assert within, "no progress within a run"
    assert all(0 < e.run_done <= e.run_total == 12 for e in within)
    # The second run's estimate comes from the plain speed the first one measured.
    later = [e for e in within if e.done == 1]
    left = [e.seconds_left or 0.0 for e in later]
    assert left and all(e.seconds_left is not None for e in later)
    assert left == sorted(left, reverse=True) and left[0] > 0
    # Without progress_every, runs stay silent between rounds.
    quiet = list(calibrate(pair, PROMPTS[:1], [0, 2], max_tokens=12))
    assert not [e for e in quiet if isinstance(e, CalibrationProgress) and e.run_done]


def test_costs_are_measured_on_the_paths_the_replies_run(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Tune before any reply measures the models as the decoder runs them: prepared (a hybrid's
    states noted, so each width's rows go back) and under the decoder's attention path."""
    from app.engine import attention
    from app.engine import decoder as decoder_module
    from app.engine.decoder import Decoder
    from app.engine.options import EngineOptions

    seen: list[tuple[str | None, str]] = []
    fresh = load_pair(tiny.target, tiny.copy)
    assert fresh.draft is not None
    decoder = Decoder(
        fresh.target.model, fresh.draft.model, options=EngineOptions(attention="matmul")
    )

    def measured(*_args: object, **_kwargs: object):
        seen.append((decoder.refused, attention.mode()))
        return iter(())

    monkeypatch.setattr(decoder_module, "measure_profile", measured)
    assert list(calibrate(fresh, PROMPTS, KS, decoder=decoder)) == []
    assert seen == [("", "matmul")]  # not the process's own (sdpa here)
