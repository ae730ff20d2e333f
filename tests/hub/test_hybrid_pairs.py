"""A hybrid pair (Qwen3.5-style Gated DeltaNet target and draft) in the pair check, the
draft suggestions, the memory fit, the catalog and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main as tandem
from app.engine.recurrent import MARKS, ROWS_KEPT, TARGET_FORWARDS, steps_kept
from app.hub.catalog import load_catalog, recommend, suggest_drafts
from app.hub.fit import cache_layout, kv_cache_bytes, memory_fit
from app.hub.library import inspect_model
from app.hub.pair_check import check_pair
from app.testing.tiny import build_model
from tests.conftest import TinyModels
from tests.engine.families import hybrid_config


@pytest.fixture(scope="module")
def hybrid(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny Qwen3.5-style target and a smaller draft of the family, one tokenizer."""
    root = tmp_path_factory.mktemp("hybrid")
    target = build_model(
        root / "qwen3_5-target", hybrid_config("qwen3_5"), tokenizer_from=tiny.target
    )
    small = hybrid_config("qwen3_5", seed_layers=2)
    small["text_config"].update(hidden_size=32, intermediate_size=64)
    small.update(hidden_size=32, intermediate_size=64)
    draft = build_model(root / "qwen3_5-draft", small, tokenizer_from=tiny.target, seed=3)
    return target, draft


def test_a_hybrid_pair_passes_the_check_and_its_draft_is_suggested(hybrid) -> None:
    target, draft = hybrid
    verdict = check_pair(target, draft)
    checks = {c.name: c for c in verdict.checks}
    assert checks["cache rewind"].ok, checks["cache rewind"].detail
    assert verdict.compatible
    assert suggest_drafts(target, [inspect_model(draft)]) == [inspect_model(draft)]


def test_the_fit_counts_attention_layers_and_recurrent_states(hybrid) -> None:
    target, _ = hybrid
    config = json.loads((target / "config.json").read_text())
    caches = cache_layout(config)
    assert caches is not None
    assert (caches.growing, caches.windows) == (2, ())  # attention every 2nd of 4 layers
    state = caches.state
    assert state > 0
    fit = memory_fit(target, None, context_length=1024, available=10**12)
    assert fit.kv_bytes == kv_cache_bytes(config, 1024) // 2
    # A request's, its marked copies, one before each of its newest rounds and, off
    # Metal, one a verified row.
    rows = ROWS_KEPT if steps_kept() else 0
    assert fit.state_bytes == state * (1 + MARKS + TARGET_FORWARDS + rows)
    assert "recurrent states" in fit.detail


@pytest.mark.parametrize("family", ["mamba", "mamba2"])
def test_a_model_of_recurrent_layers_alone_fits_by_its_states(
    family: str, tiny: TinyModels, tmp_path: Path
) -> None:
    config = hybrid_config(family)
    for attention in ("num_attention_heads", "num_key_value_heads"):  # as Falcon-Mamba's
        del config[attention]
    target = build_model(tmp_path / family, config, tokenizer_from=tiny.target)
    fit = memory_fit(target, None, context_length=1024, available=10**12)
    assert fit.kv_bytes == 0
    assert fit.state_bytes > 0 and "recurrent states" in fit.detail


def test_the_catalog_recommends_the_hybrid_pair_where_it_is_the_largest_that_fits() -> None:
    pair = recommend(load_catalog(), 26 * 10**9)
    assert pair is not None and "Qwen3.6" in pair.name


def test_check_pair_and_generate_take_a_hybrid_pair(
    hybrid, capfd: pytest.CaptureFixture[str]
) -> None:
    target, draft = hybrid
    assert tandem(["check-pair", str(target), str(draft)]) == 0
    assert capfd.readouterr().out.startswith("compatible")
    args = ["--model", str(target), "--temp", "0", "--max-tokens", "12", "--json", "Hi"]
    assert tandem(["generate", *args, "--num-draft", "0"]) == 0
    plain = json.loads(capfd.readouterr().out)
    assert tandem(["generate", *args, "--draft", str(draft), "--num-draft", "4"]) == 0
    drafted = json.loads(capfd.readouterr().out)
    assert drafted["text"] == plain["text"]
    assert drafted["drafted"] > 0


def test_a_reply_reserves_room_for_its_recurrent_states(hybrid) -> None:
    from app.engine import Message, load_pair
    from app.services.engine_service import reply_kv_bytes

    target, _ = hybrid
    pair = load_pair(target)
    caches = cache_layout(pair.target.config)
    assert caches is not None
    assert reply_kv_bytes(pair, [Message("user", "Hi")], 16) >= caches.state * (1 + MARKS)
