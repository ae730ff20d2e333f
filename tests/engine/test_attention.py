from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import mlx.core as mx
import pytest

from app.engine import attention, load_pair
from app.engine.attention import BUCKET
from app.engine.decoder import Decoder, take_turns
from app.engine.options import EngineOptions
from app.engine.packed import packed_forward
from app.engine.rounds import Round
from app.engine.types import DraftSetting, GenerationParams
from tests.conftest import TinyModels

SDPA = EngineOptions(attention="sdpa")


@pytest.fixture(params=["bucketed", "matmul"])
def bucketed(request) -> Iterator[EngineOptions]:
    """Options that verify over bucketed key lengths, one way or the other."""
    yield EngineOptions(attention=request.param)
    attention.set_mode("auto")


@pytest.mark.parametrize("mask_kind", ["causal", "bool", "additive", None])
def test_matmul_attention_matches_the_fused_kernel(mask_kind) -> None:
    mx.random.seed(0)
    b, hq, hkv, length, s, d = 1, 8, 2, 4, 11, 16
    q = mx.random.normal((b, hq, length, d))
    k = mx.random.normal((b, hkv, s, d))
    v = mx.random.normal((b, hkv, s, d))
    causal = mx.arange(s)[None, :] <= mx.arange(length)[:, None] + (s - length)
    mask = {
        "causal": "causal",
        "bool": causal,
        "additive": mx.where(causal, 0.0, -1e9),
        None: None,
    }[mask_kind]
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    got = attention.matmul_attention(q, k, v, 0.25, mask)
    assert mx.allclose(got, want, atol=1e-5).item()


def test_greedy_stays_exact_with_bucketed_verification(
    bucketed, tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = attention.bucketed_attention

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args[0].shape[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "bucketed_attention", counting)
    pair = load_pair(tiny.target, tiny.noisy)
    prompt = list(range(30, 70))

    def run(decoder: Decoder, **params) -> list[int]:
        gen = decoder.generate(prompt, GenerationParams(**params))
        next(gen)
        out: list[int] = []
        while len(out) < 60:
            rnd = next(gen)
            assert isinstance(rnd, Round)
            out += rnd.tokens
        return out[:60]

    want = run(Decoder(pair.target.model, options=bucketed), drafting=DraftSetting.of(0))
    assert calls == []  # single-token steps keep the fused kernel
    assert pair.draft is not None
    assert (
        run(
            Decoder(pair.target.model, pair.draft.model, options=bucketed),
            drafting=DraftSetting.of(5),
        )
        == want
    )
    assert 6 in calls


def test_verification_attends_over_whole_buckets_after_the_cache_grows(
    bucketed, tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    lengths: list[int] = []
    real = attention.bucketed_attention

    def seen(queries, cache, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(queries, cache, *args, **kwargs)
        lengths.append(min(cache.keys.shape[2], -(-cache.offset // BUCKET) * BUCKET))
        return out

    monkeypatch.setattr(attention, "bucketed_attention", seen)
    pair = load_pair(tiny.target, tiny.noisy)
    assert pair.draft is not None
    # Rounds cross column 256 at an offset mlx-lm's growth leaves unaligned.
    prompt = list(range(30, 230)) + list(range(30, 67))
    params = GenerationParams(drafting=DraftSetting.of(5), max_tokens=48)
    plain = Decoder(pair.target.model, options=bucketed)
    want = take_turns([plain.generate(prompt, params)], 48).replies
    spec = Decoder(pair.target.model, pair.draft.model, options=bucketed)
    got = take_turns([spec.generate(prompt, params)], 48)
    assert got.replies == want
    assert max(lengths) > BUCKET and all(n % BUCKET == 0 for n in lengths)


def test_bucketed_attention_matches_plain_attention() -> None:
    from mlx_lm.models.cache import KVCache

    mx.random.seed(1)
    cache = KVCache()
    cache.update_and_fetch(mx.random.normal((1, 2, 300, 16)), mx.random.normal((1, 2, 300, 16)))
    cache.trim(10)  # stale keys beyond the offset must be masked out
    k, v = cache.update_and_fetch(mx.random.normal((1, 2, 5, 16)), mx.random.normal((1, 2, 5, 16)))
    q = mx.random.normal((1, 8, 5, 16))
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")
    for matmul in (False, True):
        got = attention.bucketed_attention(q, cache, 0.25, matmul=matmul)
        assert mx.allclose(got, want, atol=1e-5).item()


def test_auto_mode_buckets_only_on_cuda() -> None:
    assert attention.resolve("auto") == ("bucketed" if mx.cuda.is_available() else "sdpa")
    assert attention.resolve("matmul") == "matmul"


def test_padding_fills_whole_row_blocks_only_where_verification_buckets() -> None:
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    plain, rotating = [KVCache(), KVCache()], [KVCache(), RotatingKVCache(max_size=64)]
    assert attention.padding(70, plain) == 0  # sdpa: shapes cost nothing to build
    attention.set_mode("bucketed")
    try:
        assert [attention.padding(n, plain) for n in (1, 64, 70, 128)] == [63, 0, 58, 0]
        assert attention.padding(70, rotating) == 0  # its pad could push real rows out
    finally:
        attention.set_mode("auto")


def _rows_seen(model) -> list[int]:  # type: ignore[no-untyped-def]
    """Rows of every forward of ``model`` of more than one row, from now on."""
    seen: list[int] = []
    cls = type(model)

    class Spy(cls):  # type: ignore[misc, valid-type]
        def __call__(self, inputs, *args, **kwargs):  # type: ignore[no-untyped-def]
            if inputs.shape[-1] > 1:
                seen.append(inputs.shape[-1])
            return super().__call__(inputs, *args, **kwargs)

    Spy.__module__ = cls.__module__  # where its attention is installed
    model.__class__ = Spy
    return seen


@pytest.mark.parametrize("prompt_len", [70, 600])
def test_the_lone_decoder_reads_prompts_in_whole_row_blocks(
    bucketed, tiny: TinyModels, prompt_len: int
) -> None:
    prompt = [30 + i % 200 for i in range(prompt_len)]
    params = GenerationParams(drafting=DraftSetting.of(3), max_tokens=24)
    plain = Decoder(load_pair(tiny.target).target.model, options=SDPA)
    want = take_turns([plain.generate(prompt, params)], 24)
    pair = load_pair(tiny.target, tiny.noisy)
    assert pair.draft is not None
    rows = _rows_seen(pair.target.model)
    spec = Decoder(pair.target.model, pair.draft.model, options=bucketed)
    got = take_turns([spec.generate(prompt, params)], 24)
    assert got.replies == want.replies  # the pads were cut off again
    reads = [n for n in rows if n > attention.MAX_QUERIES]
    assert reads and all(n % attention.ROWS == 0 for n in reads)


def test_the_batch_reads_prompts_in_whole_row_blocks(
    bucketed, tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.engine import merged as joint_module

    prompts = [[30 + i % 150 for i in range(n)] for n in (70, 91, 300)]
    params = GenerationParams(drafting=DraftSetting.of(3), max_tokens=24)
    plain = replace(params, drafting=DraftSetting.of(0))
    target = load_pair(tiny.target).target.model
    solo = Decoder(target, options=SDPA)
    want = [take_turns([solo.generate(p, plain)], 24).replies[0] for p in prompts]
    reads: list[list[int]] = []
    real = packed_forward  # what batch calls until patched below

    def spy(model, tokens, caches):  # type: ignore[no-untyped-def]
        if any(len(t) > attention.MAX_QUERIES for t in tokens):
            reads.append([len(t) for t in tokens])
        return real(model, tokens, caches)

    monkeypatch.setattr(joint_module, "packed_forward", spy)
    pair = load_pair(tiny.target, tiny.noisy)
    assert pair.draft is not None
    batch = Decoder(pair.target.model, pair.draft.model, options=bucketed)
    got = take_turns([batch.generate(p, params) for p in prompts], 24)
    assert got.replies == want
    assert reads and all(n % attention.ROWS == 0 for rows in reads for n in rows)


def test_the_engine_resolves_auto_on_first_use_unless_a_mode_was_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The app and `tandem serve` never set a mode: on CUDA they bucket as the bench does.
    from mlx_lm.models.cache import KVCache

    monkeypatch.setattr(attention, "_state", {})
    monkeypatch.setattr(attention, "resolve", lambda mode: "bucketed" if mode == "auto" else mode)
    assert attention.mode() == "bucketed"
    assert attention.padding(10, [KVCache()]) == attention.ROWS - 10
    attention.set_mode("sdpa")
    assert attention.mode() == "sdpa"
