from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from app.errors import ModelError
from app.hub.fit import (
    MemoryFit,
    cache_layout,
    kv_cache_bytes,
    memory_fit,
    request_cache_bytes,
    total_memory_bytes,
    usable_memory_bytes,
)
from app.hub.library import human_size
from app.testing.tiny import model_config
from tests.conftest import TinyModels
from tests.engine.families import next_n_config
from tests.fakes import as_fp8


def _weights(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def test_kv_cache_bytes_matches_a_hand_computation() -> None:
    config = model_config("llama")  # 2 layers, 4 heads, 2 KV heads, hidden 64
    # K and V × 2 layers × 2 KV heads × head size 64 / 4 × 100 tokens × 2 bytes
    assert kv_cache_bytes(config, 100) == 2 * 2 * 2 * 16 * 100 * 2
    assert kv_cache_bytes(config, 100, dtype_bytes=4) == 2 * 2 * 2 * 16 * 100 * 4


@pytest.mark.parametrize(
    ("family", "per_token"),
    [
        ("glm4_moe_lite", 32 + 8),  # GLM-4.7-Flash: a latent and a rope key a token
        ("deepseek_v32", 32 + 8 + 2 * 16),  # DeepSeek-V3.2: and its indexer's key (and zeros)
    ],
)
def test_an_mla_models_kv_cache_is_what_its_cache_holds(family: str, per_token: int) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from app.engine.loader import config_model

    config = next_n_config(family)  # two layers, latent 32 wide, rope key 8
    model = config_model(config)
    cache = make_prompt_cache(model)
    model(mx.zeros((1, 40), dtype=mx.int32), cache=cache)
    assert kv_cache_bytes(config, 40, dtype_bytes=4) == _held(cache) == 2 * per_token * 40 * 4


@pytest.mark.parametrize("family", ["longcat_flash", "longcat_flash_ngram"])
def test_longcat_flash_counts_its_two_attentions_a_layer(family: str) -> None:
    from mlx_lm.models.cache import make_prompt_cache

    from app.engine.loader import config_model
    from tests.engine.families import hybrid_config

    # LongCat-Flash's own config names these; the n-gram model's class fills them in.
    flash = {"attention_method": "MLA", "zero_expert_type": "identity", "attention_bias": False}
    config = {**hybrid_config("longcat_flash_ngram"), **flash, "model_type": family}
    del config["num_hidden_layers"]  # its configs name num_layers
    model = config_model(config)
    cache = make_prompt_cache(model)
    model(mx.zeros((1, 40), dtype=mx.int32), cache=cache)
    assert kv_cache_bytes(config, 40, dtype_bytes=4) == _held(cache) == 2 * 2 * (16 + 8) * 40 * 4
    kv, _ = request_cache_bytes(config, 40)
    assert kv == kv_cache_bytes(config, 40)


def test_deepseek_v4_counts_its_windows_and_compressed_groups() -> None:
    from app.engine.caches import new_cache, prefill
    from app.engine.loader import config_model
    from app.engine.rounds import prepare
    from app.engine.sparse import SparseCache
    from tests.engine.families import window_config

    config = window_config("deepseek_v41")
    model = config_model(config)
    prepare(model, None)
    cache = new_cache(model)
    prefill(model, cache, list(range(1, 41)))
    parts = [(c._rows, c.compress_kv, c.index_k) for c in cache if isinstance(c, SparseCache)]
    held = sum(a.nbytes for layer in parts for a in layer if a is not None)
    assert kv_cache_bytes(config, 40, dtype_bytes=4) == held
    # Past the window only the groups grow: 2 indexed layers of 4 rows a group (a latent and
    # an index key, 16 wide each) and one of a row a group (a latent), 2 bytes a value.
    grown = kv_cache_bytes(config, 40_000) - kv_cache_bytes(config, 20_000)
    assert grown == (2 * 20_000 // 4 * (16 + 16) + 20_000 * 16) * 2


def _held(cache: list[Any]) -> int:
    """What the tokens read fill of a cache's key and value buffers."""
    from mlx_lm.models.cache import CacheList, KVCache

    layers = [layer.caches if isinstance(layer, CacheList) else [layer] for layer in cache]
    kv: list[Any] = [c for caches in layers for c in caches if isinstance(c, KVCache)]
    return sum(int(a[..., : c.offset, :].nbytes) for c in kv for a in (c.keys, c.values))


def test_kv_cache_bytes_uses_head_dim_and_falls_back_to_all_heads() -> None:
    config = {"num_hidden_layers": 3, "num_attention_heads": 8, "hidden_size": 512}
    assert kv_cache_bytes(config, 10) == 2 * 3 * 8 * 64 * 10 * 2
    config["head_dim"] = 128
    config["num_key_value_heads"] = 1
    assert kv_cache_bytes(config, 10) == 2 * 3 * 1 * 128 * 10 * 2


def test_kv_cache_bytes_reads_text_config() -> None:
    # Gemma 3 12B style: the language model's settings are nested.
    text_config: dict[str, Any] = {
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "hidden_size": 3840,
    }
    config = {"model_type": "gemma3", "text_config": text_config}
    assert kv_cache_bytes(config, 8192) == 2 * 48 * 8 * 256 * 8192 * 2
    # mlx-lm's gemma3 defaults apply when the nested config leaves heads out.
    del text_config["num_attention_heads"]
    del text_config["num_key_value_heads"]
    assert kv_cache_bytes(config, 1) == 2 * 48 * 4 * 256 * 1 * 2


def test_kv_cache_bytes_rejects_a_config_without_shape() -> None:
    with pytest.raises(ModelError, match="attention shape"):
        kv_cache_bytes({"model_type": "llama"}, 10)


def test_memory_fit_with_plenty_of_memory(tiny: TinyModels) -> None:
    fit = memory_fit(tiny.target, tiny.draft, context_length=1024, available=10**12)
    assert isinstance(fit, MemoryFit)
    weights = _weights(tiny.target) + _weights(tiny.draft)
    target_kv = kv_cache_bytes(json.loads((tiny.target / "config.json").read_text()), 1024)
    draft_kv = kv_cache_bytes(json.loads((tiny.draft / "config.json").read_text()), 1024)
    assert fit.weights_bytes == weights
    assert fit.kv_bytes == target_kv + draft_kv
    assert fit.needed_bytes == int((weights + target_kv + draft_kv) * 1.1)
    assert fit.available_bytes == 10**12
    assert fit.fits
    assert human_size(fit.needed_bytes) in fit.detail
    assert "1,024 tokens" in fit.detail
    assert "1000.0 GB usable" in fit.detail
    assert "\n" not in fit.detail


def test_memory_fit_refuses_with_little_memory(tiny: TinyModels) -> None:
    fit = memory_fit(tiny.target, tiny.draft, available=2_000_000)
    assert not fit.fits
    assert fit.needed_bytes > 2_000_000
    assert "2.0 MB usable" in fit.detail
    assert f"{human_size(fit.needed_bytes - 2_000_000)} short" in fit.detail


def test_memory_fit_caps_context_at_the_models_own(tiny: TinyModels) -> None:
    # The tiny models are trained for 4,096 tokens.
    fit = memory_fit(tiny.target, None, context_length=1_000_000, available=10**12)
    config = json.loads((tiny.target / "config.json").read_text())
    assert fit.kv_bytes == kv_cache_bytes(config, 4096)
    assert fit.weights_bytes == _weights(tiny.target)
    assert "4,096 tokens" in fit.detail


def test_memory_fit_rejects_a_broken_folder(tiny: TinyModels, tmp_path: Path) -> None:
    broken = Path(shutil.copytree(tiny.draft, tmp_path / "broken"))
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match=r"broken: config\.json is unreadable"):
        memory_fit(tiny.target, broken, available=10**12)
    with pytest.raises(ModelError, match="no such folder"):
        memory_fit(tmp_path / "missing", None, available=10**12)


def test_total_and_usable_memory() -> None:
    total = total_memory_bytes()
    assert total > 0
    usable = usable_memory_bytes()
    assert 0 < usable < total
    assert usable_memory_bytes(total) < total
    assert usable_memory_bytes(1) == 0  # never negative


_GIB = 1024**3


def test_usable_memory_is_what_the_system_can_give_now(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.hub import fit

    assert usable_memory_bytes(total_memory_bytes()) > _GIB  # any machine the tests run on
    monkeypatch.setattr(fit, "available_memory_bytes", lambda: _GIB)  # other apps took the rest
    assert usable_memory_bytes() == _GIB


def test_available_memory_is_measured_on_linux() -> None:
    import sys

    from app.hub.fit import available_memory_bytes

    available = available_memory_bytes()
    if sys.platform.startswith("linux"):
        assert available is not None and 0 < available <= total_memory_bytes()


def test_what_stays_loaded_comes_off_the_ceiling_not_off_the_free_memory() -> None:
    total = 64 * _GIB
    ceiling = usable_memory_bytes(total)
    assert usable_memory_bytes(total, free=10**15, held=5 * _GIB) == ceiling - 5 * _GIB
    # The system's free memory already lacks what this process holds.
    assert usable_memory_bytes(total, free=_GIB, held=5 * _GIB) == _GIB
    assert usable_memory_bytes(total, free=10**15, held=total) == 0


def test_memory_fit_counts_a_model_kept_loaded_once(tiny: TinyModels) -> None:
    alone = memory_fit(tiny.target, tiny.draft, available=10**12)
    target = _weights(tiny.target)
    budget = alone.needed_bytes - target  # too little to read both again
    assert not memory_fit(tiny.target, tiny.draft, available=budget).fits
    kept = memory_fit(tiny.target, tiny.draft, available=budget, loaded=[tiny.target, tiny.copy])
    assert kept.fits
    assert kept.needed_bytes == alone.needed_bytes  # what the pair needs, all told
    assert kept.reused_bytes == target
    assert kept.held_bytes == target + _weights(tiny.copy)
    assert f"{human_size(target)} of it loaded already" in kept.detail


def test_memory_fit_counts_the_loaded_pair_while_the_new_one_loads(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.hub import fit

    monkeypatch.setattr(fit, "available_memory_bytes", lambda: 10**15)  # the ceiling decides
    alone = memory_fit(tiny.noisy, tiny.draft)
    beside = memory_fit(tiny.noisy, tiny.draft, loaded=[tiny.target, tiny.copy])
    held = _weights(tiny.target) + _weights(tiny.copy)
    assert beside.held_bytes == held and beside.reused_bytes == 0
    assert alone.available_bytes - beside.available_bytes == held
    assert f"while the loaded {human_size(held)} stays in memory" in beside.detail


def test_memory_fit_counts_a_targets_own_mtp_head(tiny: TinyModels, tmp_path: Path) -> None:
    from tests.engine.families import mtp_model

    target = mtp_model(tmp_path / "qwen3.5", tiny.target)
    alone = memory_fit(target, None, context_length=1024, available=10**12)
    fit = memory_fit(target, "mtp", context_length=1024, available=10**12)
    config = json.loads((target / "config.json").read_text())
    text = config["text_config"]
    layer = kv_cache_bytes(config, 1024) // text["num_hidden_layers"]  # its one attention layer
    assert fit.kv_bytes - alone.kv_bytes == layer + 1024 * text["hidden_size"] * 2
    assert fit.weights_bytes == alone.weights_bytes  # the head's weights are in the target's files


def test_memory_fit_counts_fp8_weights_as_the_bfloat16_they_load_as(
    tiny: TinyModels, tmp_path: Path
) -> None:
    folder = tmp_path / "fp8"
    shutil.copytree(tiny.target, folder)
    fp8 = sum(int(w.size) for w in as_fp8(folder).values())
    fit = memory_fit(folder, None, available=10**12)
    assert fp8 > 0 and fit.weights_bytes == _weights(folder) + fp8


def test_a_heads_cache_counts_the_mtp_layers_it_runs_not_all_its_checkpoint_has() -> None:
    from app.hub.fit import head_cache_bytes
    from tests.engine.families import next_n_config

    config = next_n_config("mimo_v2_flash")  # three MTP layers; the first drafts
    assert config["num_nextn_predict_layers"] == 3
    layer = kv_cache_bytes(config, 1024) // config["num_hidden_layers"]
    assert head_cache_bytes(config, 1024) == layer + 1024 * config["hidden_size"] * 2


@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss", "mimo_v2_flash", "llama4", "gemma3n"])
def test_a_sliding_window_layer_counts_the_rows_its_cache_holds_not_the_context(
    family: str,
) -> None:
    from app.engine.caches import ChunkKVCache, WindowKVCache, new_cache, prefill
    from app.engine.loader import config_model
    from tests.engine.families import WINDOW, window_config

    config = window_config(family)
    caches = cache_layout(config)
    assert caches is not None and caches.windows and caches.growing
    tokens = 4096
    held = WindowKVCache.rows_held(WINDOW, tokens)
    assert held < tokens
    layers = config.get("text_config", config)["num_hidden_layers"]
    row = kv_cache_bytes(config, 1) // layers  # a layer's keys and values of a token
    kv, _ = request_cache_bytes(config, tokens)
    assert kv == row * (caches.growing * tokens + len(caches.windows) * held)
    # What a window's cache holds, a long prompt read and a reply begun, is within that.
    model = config_model(config)
    cache = new_cache(model)
    prefill(model, cache, list(range(1, 1300)))
    for token in range(40):
        model(mx.array([[token]]), cache=cache)
    windows = [c for c in cache if isinstance(c, WindowKVCache | ChunkKVCache)]
    assert windows and all(c.keys is not None and c.keys.shape[2] <= held for c in windows)


def test_layers_that_keep_no_keys_of_their_own_count_for_nothing() -> None:
    from tests.engine.families import hybrid_config

    # Nemotron-H's layers: Mamba2, attention, Mamba2, an MLP; one of four keeps keys.
    config = hybrid_config("nemotron_h")
    assert config["hybrid_override_pattern"] == "M*M-"
    kv, _ = request_cache_bytes(config, 1024)
    assert kv == kv_cache_bytes(config, 1024) // 4
