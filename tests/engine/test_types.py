"""GenerationParams: the one sampling model and its one validation; Stats' one speed."""

from __future__ import annotations

import math

import pytest

from app.engine.types import (
    PARAM_RANGES,
    SEED_MAX,
    DraftSetting,
    GenerationParams,
    InvalidParamError,
    InvalidTextError,
    Stats,
    check_text,
    decode_rate,
    speedup_over,
)
from app.store import Settings
from app.store.presets import Preset


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", -0.1),
        ("temperature", 2.01),
        ("top_p", 2.0),
        ("top_p", -1.0),
        ("top_p", math.nan),
        ("top_k", -5),
        ("top_k", 2.0),
        ("top_k", True),
        ("min_p", 5.0),
        ("repetition_penalty", -1.0),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", math.nan),
        ("max_tokens", 0),
        ("max_tokens", 131_073),
        ("seed", -1),
        ("seed", SEED_MAX + 1),
        ("seed", 2**70),
        ("repetition_context_size", -1),
        ("prompt_lookup", 1),
        ("accept_rule", "other"),
    ],
)
def test_every_out_of_range_value_is_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidParamError) as raised:
        GenerationParams(**{field: value})  # type: ignore[arg-type]
    assert raised.value.name == field
    assert str(raised.value).startswith(f"{field} must be ")
    assert isinstance(raised.value, ValueError)


def test_the_edges_are_taken_and_every_seed_keys_its_draws() -> None:
    from app.engine.sampling import Draws

    edges = GenerationParams(
        max_tokens=131_072, temperature=2, top_p=0.0, top_k=0, min_p=1.0, seed=SEED_MAX
    )
    assert edges.seed == 2**64 - 1
    draws = Draws(edges.seed)  # the whole range keys draws of its own
    assert draws.key(0).tolist() != Draws(0).key(0).tolist()
    GenerationParams(seed=0, drafting=DraftSetting.of(0, 16), repetition_penalty=2.0)


def test_settings_presets_and_params_share_defaults_and_ranges() -> None:
    params, settings, preset = GenerationParams(), Settings(), Preset("P")
    for field in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
        assert getattr(params, field) == getattr(settings, field) == getattr(preset, field)
    assert params.max_tokens == 1024
    top_k_max = PARAM_RANGES["top_k"].hi
    Preset("Wide", top_k=int(top_k_max), seed=SEED_MAX).validated()  # the model's range
    with pytest.raises(ValueError, match="repetition_penalty must be a number from 1 to 2"):
        Preset("Low", repetition_penalty=0.5).validated()


def test_text_that_is_not_utf8_is_refused_with_where() -> None:
    check_text("plain and ünïcode 🙂")
    with pytest.raises(InvalidTextError, match=r"the prompt is not valid UTF-8 text \(character 2"):
        check_text("a\ud800", "the prompt")


def test_speed_is_tokens_over_decoding_time_against_the_plain_rate() -> None:
    # 6 s from start to end, of which the rounds decoded for 2 s (drafting plus verifying).
    stats = Stats(
        tokens=20,
        generation_seconds=6.0,
        draft_seconds=0.5,
        verify_seconds=3.5,
        baseline_tps=4.0,
    )
    assert stats.decode_seconds == 4.0
    assert stats.generation_tps == 5.0 == decode_rate(20, 4.0)
    assert stats.speedup == 1.25 == speedup_over(5.0, 4.0, 16)
    assert stats.as_dict()["generation_tps"] == 5.0 and stats.as_dict()["decode_seconds"] == 4.0
    # A remote engine times no rounds: its generation time is all there is.
    assert Stats(tokens=10, generation_seconds=2.0).generation_tps == 5.0
    assert Stats(tokens=0, generation_seconds=1.0, baseline_tps=4.0).speedup is None
    assert decode_rate(3, 0.0) is None and speedup_over(5.0, None, 16) is None


def test_a_reply_too_short_to_time_has_no_speedup_and_says_why() -> None:
    from app.engine.types import MIN_TIMED_TOKENS, speedup_missing

    # "Apple": two tokens, the first steps' overheads, read as 0.35x plain before.
    short = Stats(tokens=2, draft_seconds=0.1, verify_seconds=1.9, drafted=4, baseline_tps=3.0)
    assert short.speedup is None
    assert speedup_missing(short.baseline_tps, short.tokens) == "too short to measure"
    timed = Stats(tokens=MIN_TIMED_TOKENS, verify_seconds=4.0, drafted=8, baseline_tps=2.0)
    assert timed.speedup == 2.0
    assert speedup_missing(None, 100) == "plain speed not measured yet"


@pytest.mark.parametrize(("written", "k"), [("auto", None), ("0", 0), ("16", 16), (4, 4), (0, 0)])
def test_a_written_draft_length_is_auto_or_a_whole_number_in_range(written, k) -> None:
    from app.engine.types import DraftSetting

    setting = DraftSetting.parse(written, limit=8)
    assert setting.num_draft == k and setting.limit == 8
    assert DraftSetting.parse(str(setting), limit=8) == setting  # written back as it reads


@pytest.mark.parametrize("written", ["17", 17, -1, "many", True, None, 2.0, ""])
def test_a_written_draft_length_out_of_range_names_the_rule(written) -> None:
    from app.engine.types import DraftSetting, InvalidParamError

    with pytest.raises(InvalidParamError, match="'auto' or a whole number from 0 to 16"):
        DraftSetting.parse(written)


@pytest.mark.parametrize(
    ("fields", "name"),
    [(dict(k=-1), "num_draft"), (dict(k=17), "num_draft"), (dict(limit=0), "k_max"),
     (dict(limit=17), "k_max"), (dict(auto=1), "auto"), (dict(k=True), "num_draft")],
)  # fmt: skip
def test_a_draft_setting_out_of_range_is_refused_where_it_is_made(fields, name) -> None:
    from app.engine.types import DraftSetting, InvalidParamError

    with pytest.raises(InvalidParamError) as caught:
        DraftSetting(**fields)
    assert caught.value.name == name


def test_settings_presets_and_params_share_one_sampling_declaration() -> None:
    from dataclasses import fields

    from app.engine.types import DraftSetting, GenerationParams, InvalidParamError, Sampling
    from app.store.presets import Preset
    from app.store.settings import Settings

    shared = {f.name for f in fields(Sampling)}
    for kind in (GenerationParams, Settings, Preset):
        assert issubclass(kind, Sampling) and shared <= {f.name for f in fields(kind)}
    chosen = Settings(temperature=0.7, top_k=40, drafting=DraftSetting.fixed(6))
    params = GenerationParams(**chosen.sampling())
    assert params.sampling() == chosen.sampling()
    makers = (GenerationParams, Settings, lambda **kw: Preset("p", **kw))
    for make in makers:  # each checks what it shares the same way
        with pytest.raises(InvalidParamError, match="top_p must be a number from 0 to 1"):
            make(top_p=1.5)
