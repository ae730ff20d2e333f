"""The one decoder, one request at a time: exact greedy, lossless sampling, costs and cancels."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import cast

import mlx.core as mx
import numpy as np
import pytest

from app.engine import Chunk, Finished, GenerationParams, Message, Origin, adaptive, load_pair
from app.engine import decoder as spec
from app.engine.costs import PLAIN_BURST, PlainPace
from app.engine.decoder import PROBE, Decoder
from app.engine.generate import encode_chat, new_decoder, stream_reply
from app.engine.observe import PlainBurst
from app.engine.options import EngineOptions
from app.engine.rounds import CacheError, Prefill, Round, verify_sampled
from app.engine.sampling import log_probs, penalize
from app.engine.types import DraftSetting, Reading
from app.testing import synthetic as syn
from tests.conftest import TinyModels
from tests.engine.cases import CUTOFF_CASES
from tests.fakes import chi_square


def _tokens(decoder: Decoder, prompt: list[int], n: int, **params) -> tuple[list[int], list[Round]]:
    gen = decoder.generate(prompt, GenerationParams(**params))
    assert isinstance(next(gen), Prefill)
    out: list[int] = []
    rounds: list[Round] = []
    while len(out) < n:
        rnd = next(gen)
        assert isinstance(rnd, Round)
        rounds.append(rnd)
        out += rnd.tokens
    gen.close()
    return out[:n], rounds


def _round(gen: Iterator[Reading | Prefill | Round]) -> Round:
    rnd = next(gen)
    assert isinstance(rnd, Round)
    return rnd


def _finished(events: Iterable[Reading | Chunk | Finished]) -> Finished:
    *_, last = events
    assert isinstance(last, Finished)
    return last


def _ints(a: mx.array) -> list[int]:
    return cast(list[int], a.tolist())


@pytest.fixture(scope="module")
def models(tiny: TinyModels):
    pairs = {
        name: load_pair(tiny.target, getattr(tiny, name)) for name in ("noisy", "draft", "copy")
    }
    return pairs


PROMPT_IDS = list(range(40, 80)) + list(range(40, 60))  # repeats, so lookup finds n-grams


@pytest.mark.parametrize("draft_name", ["noisy", "draft", None])
@pytest.mark.parametrize(
    "params",
    [
        dict(drafting=DraftSetting.of(3)),
        dict(drafting=DraftSetting.of(None, 6)),
        dict(drafting=DraftSetting.of(5), prompt_lookup=True),
        dict(drafting=DraftSetting.of(2), repetition_penalty=1.3),
        dict(
            drafting=DraftSetting.of(None),
            prompt_lookup=True,
            repetition_penalty=1.2,
            repetition_context_size=8,
        ),
    ],
)
def test_greedy_is_exact_for_every_source(models, draft_name, params) -> None:
    pair = models["noisy"]
    draft = models[draft_name].draft.model if draft_name else None
    want, _ = _tokens(
        Decoder(pair.target.model),
        PROMPT_IDS,
        48,
        drafting=DraftSetting.of(0),
        **{k: v for k, v in params.items() if k.startswith("repetition")},
    )
    if draft is None and not params.get("prompt_lookup"):
        params = {**params, "prompt_lookup": True}
    got, rounds = _tokens(Decoder(pair.target.model, draft), PROMPT_IDS, 48, **params)
    assert got == want
    if draft is not None:
        assert any(r.k for r in rounds)


def test_greedy_is_exact_when_lookup_proposes_wrong_tokens() -> None:
    target = syn.build("tiny")
    # The reply's first tokens are plain steps, two probes after the first: 14, 15, ...
    # After its last two the prompt continued with 200, 201; the model continues the count.
    plain = 1 + 2 * PROBE
    prompt = [*range(10, 14 + plain), 200, 201, 202, 203, 30, 31, 10, 11, 12, 13]
    want, _ = _tokens(Decoder(target), prompt, 60, drafting=DraftSetting.of(0))
    got, rounds = _tokens(
        Decoder(target), prompt, 60, drafting=DraftSetting.of(4), prompt_lookup=True
    )
    assert got == want
    assert any(r.source == "lookup" and r.accepted < r.k for r in rounds)


def test_verify_keeps_the_target_distribution_exactly() -> None:
    """Monte Carlo of the accept/resample step against p, with a stated threshold."""
    mx.random.seed(0)
    rng = np.random.default_rng(0)
    vocab, k, n = 6, 2, 6000
    p = mx.array(rng.dirichlet(np.ones(vocab), size=k + 1), dtype=mx.float32)
    q = mx.array(rng.dirichlet(np.ones(vocab), size=k), dtype=mx.float32)
    first = np.zeros(vocab)
    accepted_first = 0
    for _ in range(n):
        proposal = mx.random.categorical(mx.log(q))
        accept, fallback = verify_sampled(p, q, proposal)
        ok = cast(list[bool], accept.tolist())
        token = _ints(proposal)[0] if ok[0] else _ints(fallback)[0]
        first[token] += 1
        accepted_first += ok[0]
    tv = 0.5 * np.abs(first / n - np.array(p[0])).sum()
    assert tv < 0.03, tv  # expected about 0.01 at n = 6000
    tv_pq = 0.5 * np.abs(np.array(p[0]) - np.array(q[0])).sum()
    assert tv_pq > 0.1  # the test could tell p from q
    # Acceptance is sum(min(p, q)), not mlx-lm's sum(p * q).
    want = float(mx.minimum(p[0], q[0]).sum())
    assert abs(accepted_first / n - want) < 0.03


def test_match_rule_accepts_sum_p_times_q() -> None:
    mx.random.seed(1)
    rng = np.random.default_rng(1)
    p = mx.array(rng.dirichlet(np.ones(5), size=2), dtype=mx.float32)
    q = mx.array(rng.dirichlet(np.ones(5), size=1), dtype=mx.float32)
    n, hits = 4000, 0
    for _ in range(n):
        proposal = mx.random.categorical(mx.log(q))
        accept, _ = verify_sampled(p, q, proposal, rule="match")
        hits += cast(list[bool], accept.tolist())[0]
    assert abs(hits / n - float((p[0] * q[0]).sum())) < 0.03


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=0.6),
        dict(temperature=0.9, top_p=0.9, top_k=40, min_p=0.02, repetition_penalty=1.2),
    ],
)
def test_sampled_first_token_has_the_target_distribution(models, params) -> None:
    """Chi-square test of speculative samples against the target's exact distribution."""
    pair = models["noisy"]
    gp = GenerationParams(drafting=DraftSetting.of(3), **params)
    prompt = PROMPT_IDS[:20]
    decoder = Decoder(
        pair.target.model, pair.draft.model, options=EngineOptions(probe_every=0)
    )  # every round speculates
    n = 2000
    counts = np.zeros(pair.target.config["vocab_size"])
    rejected = 0
    for i in range(n):  # each request its own seed: independent draws, the same every run
        t, rounds = _tokens(decoder, prompt, 1, **params, drafting=DraftSetting.of(3), seed=i)
        counts[t[0]] += 1
        rejected += rounds[0].accepted == 0
    assert rejected > n // 10  # the residual path is exercised
    # The exact distributions of the first token.
    exact = []
    for model in (pair.target.model, pair.draft.model):
        logits = model(mx.array(prompt)[None])[0, -1:].astype(mx.float32)
        if gp.repetition_penalty != 1.0:
            ctx = mx.array(prompt[-gp.repetition_context_size :])
            logits = penalize(logits, [ctx], gp.repetition_penalty)
        exact.append(np.array(mx.exp(log_probs(logits, gp))[0], dtype=np.float64))
    p, q = exact
    stat, critical = chi_square(counts, p)
    assert stat < critical, (stat, critical)
    # Power: samples from the draft's q would fail the same test by far.
    assert chi_square(n * q, p)[0] > 5 * critical


def test_copy_draft_is_always_accepted_when_sampling(models) -> None:
    pair = models["copy"]
    _, rounds = _tokens(
        Decoder(pair.target.model, pair.draft.model),
        PROMPT_IDS,
        40,
        drafting=DraftSetting.of(4),
        temperature=0.8,
        top_p=0.95,
        repetition_penalty=1.1,
    )
    spec = [r for r in rounds if r.k]
    assert spec and all(r.accepted == r.k for r in spec)


def test_lookup_alone_proposes_and_is_credited() -> None:
    target = syn.build("tiny")
    decoder = Decoder(target)
    out, rounds = _tokens(
        decoder, syn.prompt("tiny"), 120, drafting=DraftSetting.of(6), prompt_lookup=True
    )
    assert out == [syn.CYCLE_START + i % 64 for i in range(120)]
    lookup_rounds = [r for r in rounds if r.source == "lookup"]
    assert lookup_rounds
    assert all(r.accepted == r.k for r in lookup_rounds)
    assert sum(o == Origin.LOOKUP for r in rounds for o in r.origins) > 90


def test_lookup_runs_before_the_draft_model() -> None:
    target = syn.build("tiny")
    draft = syn.build("tiny", miss=0.5, seed=1)
    decoder = Decoder(target, draft)
    # A prompt without the cycle's later half: lookup runs dry there, the draft fills in.
    prompt = syn.prompt("tiny", repeats=1)[:40]
    out, rounds = _tokens(decoder, prompt, 150, drafting=DraftSetting.of(4), prompt_lookup=True)
    assert out == [syn.CYCLE_START + (40 + i) % 64 for i in range(150)]
    sources = {r.source for r in rounds}
    assert "draft" in sources
    assert sources & {"lookup", "lookup+draft"}


def test_synthetic_pair_has_the_set_acceptance() -> None:
    target = syn.build("tiny")
    cycle = mx.array(syn.prompt("tiny", repeats=1))[None]
    want = mx.argmax(target(cycle)[0], axis=-1)
    assert want.tolist() == [syn.CYCLE_START + (i + 1) % 64 for i in range(64)]
    for miss in (0.0, 0.25, 0.5):
        draft = syn.build("tiny", miss=miss, seed=1)
        got = mx.argmax(draft(cycle)[0], axis=-1)
        assert (got != want).sum().item() == round(miss * 64)
    _, rounds = _tokens(
        Decoder(target, syn.build("tiny", seed=1)),
        syn.prompt("tiny"),
        100,
        drafting=DraftSetting.of(3),
    )
    spec = [r for r in rounds if r.k]
    assert spec and all(r.accepted == r.k for r in spec)


def test_follow_up_turn_prefills_only_new_tokens(tiny: TinyModels) -> None:
    pair = load_pair(tiny.target, tiny.noisy)
    decoder = new_decoder(pair)  # the conversation's: it keeps both caches between turns
    params = GenerationParams(max_tokens=12, drafting=DraftSetting.of(3))
    first = [Message("user", "Write a haiku about the sea.")]
    out = list(stream_reply(pair, first, params, decoder=decoder))
    reply = "".join(e.text for e in out if isinstance(e, Chunk))
    assert _finished(out).stats.reused_tokens == 0
    second = [*first, Message("assistant", reply), Message("user", "Another one.")]
    warm = _finished(stream_reply(pair, second, params, decoder=decoder))
    prompt1 = encode_chat(pair.target.tokenizer, first)
    assert warm.stats.reused_tokens >= len(prompt1) - 1
    assert warm.stats.prompt_tokens > warm.stats.reused_tokens
    # The warm reply is the reply a cold decoder gives.
    cold = _finished(stream_reply(pair, second, params))
    assert cold.stats.reused_tokens == 0
    assert warm.token_ids == cold.token_ids


def test_edit_trims_to_the_common_prefix(tiny: TinyModels) -> None:
    pair = load_pair(tiny.target, tiny.noisy)
    a = [Message("user", "Tell me about the sea and the sky.")]
    b = [Message("user", "Tell me about the moon.")]
    decoder = new_decoder(pair)
    params = GenerationParams(max_tokens=20, drafting=DraftSetting.of(3))
    list(stream_reply(pair, a, params, decoder=decoder))
    edited = _finished(stream_reply(pair, b, params, decoder=decoder))
    tok = pair.target.tokenizer
    ia, ib = encode_chat(tok, a), encode_chat(tok, b)
    common = next(i for i, (x, y) in enumerate(zip(ia, ib, strict=False)) if x != y)
    assert edited.stats.reused_tokens == common
    fresh = _finished(stream_reply(pair, b, GenerationParams(max_tokens=20)))
    assert edited.token_ids == fresh.token_ids


def test_drafting_is_refused_when_the_cache_cannot_rewind(models) -> None:
    pair = models["noisy"]
    decoder = Decoder(pair.target.model, pair.draft.model)
    decoder.refused = "its recurrent layers keep a state that cannot be given back"
    with pytest.raises(CacheError, match="cannot verify drafts: its recurrent layers"):
        next(decoder.generate(PROMPT_IDS, GenerationParams(drafting=DraftSetting.of(3))))
    # Plain decoding still works.
    out, _ = _tokens(decoder, PROMPT_IDS, 5, drafting=DraftSetting.of(0))
    assert len(out) == 5


def test_auto_k_stays_in_bounds_and_is_reported(models) -> None:
    pair = models["copy"]
    events = list(
        stream_reply(
            pair,
            [Message("user", "Count to twenty.")],
            GenerationParams(max_tokens=60, drafting=DraftSetting.of(None, 5)),
        )
    )
    s = _finished(events).stats
    assert s.num_draft is None
    assert 1 <= s.k_min <= s.k_max <= 5
    assert s.mean_accepted is not None and s.mean_accepted > 1
    assert s.tokens_per_call is not None and s.tokens_per_call > 1
    assert s.baseline_tps is not None and s.speedup is not None


def test_drafts_with_padded_embeddings_of_another_size(tiny: TinyModels, tmp_path) -> None:
    """Qwen2.5 7B has 152064 embedding rows and 0.5B 151936 over one tokenizer."""
    from app.testing.tiny import build_model, model_config

    padded = build_model(
        tmp_path / "padded-draft",
        model_config("qwen2", vocab_size=400, hidden_size=32, num_hidden_layers=1),
        tokenizer_from=tiny.target,
        seed=5,
    )
    pair = load_pair(tiny.target, padded)
    assert pair.draft is not None
    want, _ = _tokens(Decoder(pair.target.model), PROMPT_IDS, 40, drafting=DraftSetting.of(0))
    got, _ = _tokens(
        Decoder(pair.target.model, pair.draft.model), PROMPT_IDS, 40, drafting=DraftSetting.of(3)
    )
    assert got == want
    _, sampled = _tokens(
        Decoder(pair.target.model, pair.draft.model),
        PROMPT_IDS,
        40,
        drafting=DraftSetting.of(3),
        temperature=1.0,
    )
    assert all(t < 384 for r in sampled for t in r.tokens)


def test_fit_vocab_cuts_or_pads() -> None:
    from app.engine.rounds import fit_vocab

    x = mx.array([[1.0, 2.0, 3.0]])
    assert fit_vocab(x, 2).tolist() == [[1.0, 2.0]]
    padded = fit_vocab(x, 5)
    assert padded.shape == (1, 5)
    assert cast(list[list[float]], mx.exp(padded).tolist())[0][3:] == [0.0, 0.0]


@pytest.mark.parametrize("lookup", [False, True])
def test_draft_length_changes_mid_reply_and_greedy_stays_exact(models, lookup: bool) -> None:
    from app.engine.rounds import DraftControl

    pair = models["noisy"]
    want, _ = _tokens(Decoder(pair.target.model), PROMPT_IDS, 80, drafting=DraftSetting.of(0))
    control = DraftControl(DraftSetting.fixed(3))
    decoder = Decoder(pair.target.model, pair.draft.model, options=EngineOptions(probe_every=0))
    gen = decoder.generate(PROMPT_IDS, GenerationParams(prompt_lookup=lookup), control)
    assert isinstance(next(gen), Prefill)
    # Each phase runs a few rounds: drafting at 3, off, adaptive, off again, 5.
    phases: list[tuple[int | None, list[Round]]] = []
    out: list[int] = []
    for setting in (3, 0, None, 0, 5):
        control.set(DraftSetting.of(setting))
        rounds = [_round(gen) for _ in range(4)]
        phases.append((setting, rounds))
        out += [t for r in rounds for t in r.tokens]
    gen.close()
    assert out == want[: len(out)]
    # The reply's first token is a plain step, whatever the setting.
    first = phases[0][1].pop(0)
    assert first.k == 0 and len(first.tokens) == 1
    for i, (setting, rounds) in enumerate(phases):
        if setting == 0:
            assert all(r.k == 0 and len(r.tokens) == 1 for r in rounds)
        else:
            # Out of plain decoding, the step it had queued comes first; then it drafts.
            if i and phases[i - 1][0] == 0:
                assert rounds.pop(0).k == 0
            assert all(r.k > 0 for r in rounds), setting
            assert all(r.auto == (setting is None) for r in rounds)
        if setting == 5:
            assert all(r.k == 5 for r in rounds if r.source == "draft")


def test_drafting_after_a_plain_stretch_times_its_first_round(models) -> None:
    from app.engine.costs import COST_STALE
    from app.engine.rounds import DraftControl

    pair = models["copy"]
    control = DraftControl(DraftSetting.fixed(3))
    decoder = Decoder(pair.target.model, pair.draft.model, options=EngineOptions(probe_every=0))
    gen = decoder.generate(PROMPT_IDS, GenerationParams(max_tokens=400), control)
    assert isinstance(next(gen), Prefill)
    for _ in range(12):  # drafting: the draft step measured
        _round(gen)
    control.set(DraftSetting.of(0))
    for _ in range(COST_STALE + 8):  # a plain stretch: the draft step goes stale
        _round(gen)
    control.set(DraftSetting.of(3))
    after = [_round(gen) for _ in range(4)]
    gen.close()
    first = next(r for r in after if r.k)
    # Its draft step is measured afresh rather than trusted from before the stretch.
    assert first.timed


def test_a_control_that_starts_at_zero_drafts_once_raised(models) -> None:
    from app.engine.rounds import DraftControl

    pair = models["copy"]
    control = DraftControl(DraftSetting.fixed(0))
    decoder = Decoder(pair.target.model, pair.draft.model)
    gen = decoder.generate(PROMPT_IDS, GenerationParams(), control)
    next(gen)
    assert _round(gen).k == 0
    control.set(DraftSetting.fixed(4))
    rounds = [_round(gen) for _ in range(4 + 2 * PROBE)]
    gen.close()
    # The step queued when it was raised, two probes' plain steps that time the
    # baseline (the first its warm-up), then drafting: the draft takes in this
    # short prompt with its first step.
    assert [r.k for r in rounds] == [0] * (1 + 2 * PROBE) + [4] * 3
    assert all(r.accepted == 4 for r in rounds[1 + 2 * PROBE :])


def test_plain_steps_are_timed_from_the_first_token_read(models, monkeypatch) -> None:
    """A backend may run queued steps together, and the first step waits on its launch
    with nothing to overlap: neither the gap between two tokens nor an average from the
    first step queued is a step."""
    import types

    from app.engine.costs import CostModel

    clock = [0.0]
    monkeypatch.setattr(spec, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    seen: list[float] = []
    monkeypatch.setattr(CostModel, "observe_step", lambda self, s: seen.append(s))
    gen = Decoder(models["noisy"].target.model).generate(
        PROMPT_IDS, GenerationParams(drafting=DraftSetting.of(0))
    )
    assert isinstance(next(gen), Prefill)
    clock[0] += 3.0  # the first token waits on the first step's launch
    for n in range(8):
        # Tokens come two at a time (their steps ran together while Python was
        # away); Python takes a second with each.
        assert isinstance(next(gen), Round)
        clock[0] += 2.0 if n % 2 else 0.0
    gen.close()
    # From the third token on: the steps since the first token, a second each
    # (a pair's first token reads a little early, never far below a step).
    assert seen[::2] == pytest.approx([1.0] * 3)
    assert min(seen) >= 2 / 3


def _costs(ms: Sequence[float], draft_ms: float = 1.0):  # type: ignore[no-untyped-def]
    from app.engine.costs import CostModel, CostProfile

    profile = CostProfile(tuple(v / 1e3 for v in ms), draft_ms / 1e3, 64, "test", "0")
    return CostModel(widths=len(ms), profile=profile)


# Verification of 8 rows cheaper than of 4 to 7, as on MLX's CUDA backend.
TILED = [10, 20, 30, 40, 50, 60, 70, 15, 15, 15, 15, 15, 15, 15, 15, 15, 30]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_padded_verification_keeps_the_output(models, monkeypatch, temperature) -> None:
    from app.engine.costs import CostModel

    # The plan comes from TILED alone: this machine's timings of rounds would
    # move it (a slow width 8 makes 9 the cheapest).
    for name in ("observe_verify", "observe_round", "observe_draft_step"):
        monkeypatch.setattr(CostModel, name, lambda self, *a, **kw: None)
    pair = models["noisy"]
    kw = dict(drafting=DraftSetting.of(3), temperature=temperature, seed=5)
    mx.random.seed(5)
    want, _ = _tokens(Decoder(pair.target.model, pair.draft.model), PROMPT_IDS, 40, **kw)
    padded = Decoder(pair.target.model, pair.draft.model, _costs(TILED))
    mx.random.seed(5)
    got, rounds = _tokens(padded, PROMPT_IDS, 40, **kw)
    spec = [r for r in rounds if r.k]
    assert spec and all(r.width == 8 for r in spec)  # 4 tokens verified in 8 rows
    if temperature == 0:
        assert got == want
    else:
        # Same draws, same logits in the rows that are read: the same sample.
        assert got == want


def test_the_first_token_does_not_wait_for_the_drafts_prefill(models, monkeypatch) -> None:
    pair = models["noisy"]
    prompt = (PROMPT_IDS * 6)[:300]  # more than two of the draft's catch-up chunks
    want, _ = _tokens(Decoder(pair.target.model), prompt, 30, drafting=DraftSetting.of(0))
    decoder = Decoder(pair.target.model, pair.draft.model)
    draft_calls: list[int] = []
    _before_forward(monkeypatch, pair.draft.model, lambda: draft_calls.append(1))
    gen = decoder.generate(prompt, GenerationParams(drafting=DraftSetting.of(4)))
    assert isinstance(next(gen), Prefill)
    first = next(gen)
    assert isinstance(first, Round) and first.k == 0 and len(first.tokens) == 1
    # The draft has taken in none of the prompt yet; it catches up between plain steps.
    assert draft_calls == []
    rounds = [first] + [_round(gen) for _ in range(12)]
    gen.close()
    lead = next(i for i, r in enumerate(rounds) if r.k)
    # Three catch-up chunks, each after a plain step, and two probes.
    assert lead <= 4 + 2 * PROBE and all(len(r.tokens) == 1 for r in rounds[:lead])
    assert [t for r in rounds for t in r.tokens][:30] == want[
        : len([t for r in rounds for t in r.tokens][:30])
    ]


def _before_forward(monkeypatch, model, before) -> None:  # type: ignore[no-untyped-def]
    """Calls ``before()`` ahead of each forward of ``model`` (not of others of its class)."""
    cls = type(model)
    real = cls.__call__

    def call(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self is model:
            before()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__call__", call)


def _dear_draft(monkeypatch, draft, seconds: float = 0.02) -> None:  # type: ignore[no-untyped-def]
    """Each step of ``draft`` takes ``seconds`` more: drafting does not pay, even when busy."""
    import time

    _before_forward(monkeypatch, draft, lambda: time.sleep(seconds))


def test_auto_decodes_plainly_where_drafting_cannot_pay(models, monkeypatch) -> None:
    pair = models["noisy"]
    _dear_draft(monkeypatch, pair.draft.model)
    # Each verified token costs a full step and a draft step costs another.
    dear = [10.0 * m for m in range(1, 18)]
    want, _ = _tokens(Decoder(pair.target.model), PROMPT_IDS, 80, drafting=DraftSetting.of(0))
    # One probe measures the real plain step: rounds are weighed by what they
    # really take, so plain decoding must be too.
    options = EngineOptions(probe_every=10_000)
    decoder = Decoder(
        pair.target.model, pair.draft.model, _costs(dear, draft_ms=10.0), options=options
    )
    got, rounds = _tokens(decoder, PROMPT_IDS, 80, drafting=DraftSetting.of(None))
    assert got == want
    late = rounds[len(rounds) // 2 :]
    # Now and then a try of drafting, within the exploration budget.
    assert all(r.auto for r in late) and sum(r.k > 0 for r in late) <= 2
    assert sum(len(r.tokens) for r in late if r.k == 0) >= 0.9 * sum(len(r.tokens) for r in late)


def test_autos_plain_bursts_follow_one_another_with_the_next_step_queued(
    models, monkeypatch
) -> None:
    pair = models["noisy"]
    _dear_draft(monkeypatch, pair.draft.model)
    # Tries every few hundred tokens: how soon the budget allows one depends on
    # this machine's plain step, of which it is a share.
    monkeypatch.setattr(adaptive, "EXPLORE_BUDGET", 0.2)
    dear = [10.0 * m for m in range(1, 18)]
    decoder = Decoder(
        pair.target.model,
        pair.draft.model,
        _costs(dear, draft_ms=10.0),
        options=EngineOptions(probe_every=10_000),
    )
    bursts: list[PlainBurst] = []
    decoder.subscribe(lambda e: bursts.append(e) if isinstance(e, PlainBurst) else None)
    log: list[str] = []
    target = type(pair.target.model)
    forward = target.__call__

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        log.append("F" if self is pair.target.model else "d")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(target, "__call__", counted)
    gen = decoder.generate(PROMPT_IDS, GenerationParams(drafting=DraftSetting.of(None)))
    produced = 0
    for event in gen:
        if isinstance(event, Round):
            log.append("T" if event.k == 0 else "R")
            produced += len(event.tokens)
        if produced >= 1500:  # past the ends of many plain bursts and several tries
            break
    gen.close()
    trace = "".join(log)
    assert trace.count("T") > 600 and trace.count("R") >= 2
    # Between tries (the probes' two steps come before), a burst ends with no step
    # queued only where a try follows, after the draft's catch-up: two plain tokens
    # and then a target step means the device waited between bursts.
    assert "TTF" not in trace[trace.index("R") : trace.rindex("TT")]
    assert len(bursts) > 1  # each burst is told, those that follow one another too


@pytest.mark.parametrize("stretch", [True, False])
def test_a_reply_teaches_acceptance_along_stretches_and_stays_exact(stretch: bool) -> None:
    target, draft = syn.build("tiny"), syn.build("tiny", miss=0.1, seed=1)
    prompt = syn.prompt("tiny")
    want, _ = _tokens(Decoder(target), prompt, 120, drafting=DraftSetting.of(0))
    decoder = Decoder(target, draft, options=EngineOptions(stretch=stretch))
    got, rounds = _tokens(decoder, prompt, 120, drafting=DraftSetting.of(None, 12))
    assert got == want
    assert any(r.k for r in rounds)
    rates = decoder.acceptance().stretch_rates()
    # Unseen distances all lean on the pooled rate; seen ones follow the misses.
    assert (len(set(rates)) > 1) is stretch


def test_auto_measures_unknown_widths_and_stores_the_profile(tiny, tmp_path) -> None:
    from app.engine.costs import ProfileStore
    from app.engine.generate import new_decoder

    pair = load_pair(tiny.target, tiny.noisy)
    store = ProfileStore(tmp_path / "profiles.json")
    decoder = new_decoder(pair, store)
    params = GenerationParams(drafting=DraftSetting.of(None))
    widths: set[int] = set()
    gen = decoder.generate(PROMPT_IDS, params)
    for rnd in itertools.islice(gen, 200):
        if isinstance(rnd, Round) and rnd.k:
            widths.add(rnd.width)
        if decoder.costs.complete:
            break
    gen.close()
    assert set(range(2, 18)) <= widths  # every width up to k_max + 1, padded where needed
    stored = store.get(str(tiny.target), str(tiny.noisy))
    assert stored is not None and stored.complete
    # The next decoder of the pair starts from it.
    assert new_decoder(pair, store).costs.complete


def test_a_draft_cut_short_when_unsure_keeps_greedy_exact(models) -> None:
    pair = models["draft"]  # independent weights: often unsure
    want, _ = _tokens(Decoder(pair.target.model), PROMPT_IDS, 48, drafting=DraftSetting.of(0))
    decoder = Decoder(
        pair.target.model,
        pair.draft.model,
        _costs(TILED, draft_ms=8.0),
        options=EngineOptions(draft_cutoff=True),
    )
    got, rounds = _tokens(decoder, PROMPT_IDS, 48, drafting=DraftSetting.of(8))
    assert got == want
    assert any(0 < r.k < 8 for r in rounds)


@pytest.mark.parametrize(("setting", "temperature", "num_draft", "cuts"), CUTOFF_CASES)
def test_drafts_end_early_only_where_the_cutoff_is_asked_or_measured_to_pay(
    models, monkeypatch, setting, temperature, num_draft, cuts
) -> None:
    pair = models["draft"]
    decoder = Decoder(
        pair.target.model,
        pair.draft.model,
        _costs(TILED, draft_ms=8.0),
        # No probe replaces the stored plain step: Auto drafts here, as on a large target.
        options=EngineOptions(draft_cutoff=setting, probe_every=0),
    )
    thresholds: list[float] = []
    real = Decoder._stops

    def spy(self, turns):  # type: ignore[no-untyped-def]
        stops = real(self, turns)
        thresholds.extend(stop for stop, t in zip(stops, turns, strict=True) if t.drafts)
        return stops

    monkeypatch.setattr(Decoder, "_stops", spy)
    _tokens(
        decoder,
        PROMPT_IDS,
        32,
        drafting=DraftSetting.of(num_draft),
        temperature=temperature,
        seed=3,
    )
    assert thresholds  # rounds drafted
    assert any(t > 0 for t in thresholds) is cuts


def test_rounds_teach_the_pair_what_a_round_costs_beyond_its_forwards(models) -> None:
    pair = models["draft"]
    # A profile that explains almost none of a round: the rest is its fixed cost.
    decoder = Decoder(
        pair.target.model,
        pair.draft.model,
        _costs([0.001] * 17, draft_ms=0.001),
        options=EngineOptions(probe_every=0),
    )
    assert decoder.costs.profile().overhead == 0
    _, rounds = _tokens(decoder, PROMPT_IDS, 60, drafting=DraftSetting.of(4))
    assert sum(1 for r in rounds if r.k) >= 3
    assert decoder.costs.profile().overhead > 0


@pytest.mark.parametrize("when", ["draft step", "before verify"])
def test_a_cancel_inside_a_round_ends_it_before_the_target_verifies(
    models, monkeypatch, when
) -> None:
    pair = models["noisy"]
    target, draft = pair.target.model, pair.draft.model
    fresh = PROMPT_IDS * 2 + [7]
    want, _ = _tokens(Decoder(target), fresh, 40, drafting=DraftSetting.of(0))
    decoder = Decoder(target, draft)
    _tokens(decoder, fresh[:-1], 12, drafting=DraftSetting.of(4))  # warm: the draft is caught up
    cancel = threading.Event()
    calls = {"target": 0, "draft": 0}

    def counted(name: str) -> None:
        calls[name] += 1
        # After the round's first draft step, or after its last one.
        if name == "draft" and calls["draft"] == (2 if when == "draft step" else 4):
            cancel.set()

    # An edited turn: one new token to read, then a drafting round.
    gen = decoder.generate(fresh, GenerationParams(drafting=DraftSetting.of(4)), cancel=cancel)
    assert isinstance(next(gen), Prefill)
    _before_forward(monkeypatch, draft, lambda: counted("draft"))
    _before_forward(monkeypatch, target, lambda: counted("target"))
    assert list(gen) == []  # the round ended unverified
    assert calls == {"target": 0, "draft": 2 if when == "draft step" else 4}
    monkeypatch.undo()
    # Only committed tokens stayed in the caches: the next reply is still exact.
    got, rounds = _tokens(decoder, fresh, 40, drafting=DraftSetting.of(4))
    assert got == want and any(r.accepted for r in rounds)


def test_a_cancel_while_reading_the_prompt_stops_at_the_next_chunk(models, monkeypatch) -> None:
    pair = models["noisy"]
    monkeypatch.setattr(spec, "PREFILL_CHUNK", 16)
    decoder = Decoder(pair.target.model, pair.draft.model)
    cancel = threading.Event()
    real_eval = mx.eval

    def eval_(*args):  # type: ignore[no-untyped-def]
        cancel.set()  # as the first chunk is read
        return real_eval(*args)

    monkeypatch.setattr(mx, "eval", eval_)  # the module speculative evaluates through
    assert list(decoder.generate(PROMPT_IDS, GenerationParams(), cancel=cancel)) == []
    monkeypatch.undo()
    gen = decoder.generate(PROMPT_IDS, GenerationParams())
    first = next(gen)
    gen.close()
    # The chunk read before the stop is kept, and only it.
    assert isinstance(first, Prefill) and first.reused_tokens == 16


def _reading(decoder: Decoder, prompt: list[int], **params) -> tuple[list[Reading], Prefill]:
    """The Readings a reply yields before its Prefill (the reply is then closed)."""
    gen = decoder.generate(prompt, GenerationParams(**params), reading=True)
    readings: list[Reading] = []
    for event in gen:
        if isinstance(event, Prefill):
            gen.close()
            return readings, event
        assert isinstance(event, Reading)
        readings.append(event)
    raise AssertionError("no Prefill")


def test_reading_the_prompt_is_reported_before_each_chunk(models, monkeypatch) -> None:
    pair = models["noisy"]
    monkeypatch.setattr(spec, "PREFILL_CHUNK", 16)
    decoder = Decoder(pair.target.model, pair.draft.model)
    n = len(PROMPT_IDS)  # 60: the target reads 59 of them in chunks of 16
    readings, prefill = _reading(decoder, PROMPT_IDS)
    assert readings == [Reading(d, n, 0) for d in (0, 16, 32, 48)]
    assert (prefill.prompt_tokens, prefill.reused_tokens) == (n, 0)
    # A follow-up turn reads only what follows what the cache holds (59 tokens).
    longer = PROMPT_IDS + list(range(90, 120))
    readings, prefill = _reading(decoder, longer)
    assert readings == [Reading(d, len(longer), n - 1) for d in (n - 1, n + 15)]
    assert prefill.reused_tokens == n - 1
    # Held in full, the prompt is not read again: nothing to report.
    assert _reading(decoder, longer)[0] == []
    # Without asking, a reply starts with its Prefill, as before.
    assert isinstance(next(decoder.generate(longer, GenerationParams())), Prefill)


def test_a_reply_closed_while_reading_keeps_what_it_read_and_stays_exact(
    models, monkeypatch
) -> None:
    pair = models["noisy"]
    want, _ = _tokens(Decoder(pair.target.model), PROMPT_IDS, 30, drafting=DraftSetting.of(0))
    monkeypatch.setattr(spec, "PREFILL_CHUNK", 16)
    decoder = Decoder(pair.target.model, pair.draft.model)
    gen = decoder.generate(PROMPT_IDS, GenerationParams(drafting=DraftSetting.of(3)), reading=True)
    assert next(gen) == Reading(0, len(PROMPT_IDS), 0)
    assert next(gen) == Reading(16, len(PROMPT_IDS), 0)
    gen.close()  # as a stopped reply closes it between chunks
    readings, prefill = _reading(decoder, PROMPT_IDS)
    assert prefill.reused_tokens == 16 and readings[0] == Reading(16, len(PROMPT_IDS), 16)
    got, rounds = _tokens(decoder, PROMPT_IDS, 30, drafting=DraftSetting.of(3))
    assert got == want and any(r.accepted for r in rounds)


def test_a_draft_step_is_priced_by_the_steps_after_a_rounds_first(models, monkeypatch) -> None:
    import time

    pair = models["noisy"]
    target, draft = pair.target.model, pair.draft.model
    last = {"draft": False}

    def forward(is_draft: bool) -> None:
        if is_draft and not last["draft"]:
            time.sleep(0.08)  # a round's first draft step: it starts after a sync
        last["draft"] = is_draft

    _before_forward(monkeypatch, draft, lambda: forward(True))
    _before_forward(monkeypatch, target, lambda: forward(False))
    decoder = Decoder(target, draft)
    _, rounds = _tokens(decoder, PROMPT_IDS, 60, drafting=DraftSetting.of(4))
    assert sum(r.k for r in rounds) >= 12
    step = decoder.costs.draft_step
    # The first step's 80 ms belongs to the round, not to each of its 4 tokens.
    assert step is not None and step < 0.01


def test_plain_bursts_leave_the_draft_behind_until_a_round_drafts(models, monkeypatch) -> None:
    pair = models["noisy"]
    want, _ = _tokens(Decoder(pair.target.model), PROMPT_IDS, 300, drafting=DraftSetting.of(0))
    # Drafting does not pay: Auto decodes in plain bursts, with a try now and then.
    decoder = Decoder(
        pair.target.model,
        pair.draft.model,
        _costs([10.0 * m for m in range(1, 18)], 10.0),
        options=EngineOptions(probe_every=10_000),
    )
    _dear_draft(monkeypatch, pair.draft.model, 0.004)  # dear, yet tried now and then
    log: list[int | str] = []  # "feed", or a round's k
    real = Decoder._read_into

    def read_into(self, model, chunks, caches):  # type: ignore[no-untyped-def]
        if model is pair.draft.model:
            log.append("feed")
        return real(self, model, chunks, caches)

    monkeypatch.setattr(Decoder, "_read_into", read_into)
    gen = decoder.generate(PROMPT_IDS, GenerationParams(drafting=DraftSetting.of(None)))
    assert isinstance(next(gen), Prefill)
    got: list[int] = []
    while len(got) < 300:
        rnd = next(gen)
        assert isinstance(rnd, Round)
        log.append(rnd.k)
        got += rnd.tokens
    gen.close()
    assert got[:300] == want
    feeds = [i for i, e in enumerate(log) if e == "feed"][1:]  # after the prompt's
    assert log.count(0) >= 6 * PLAIN_BURST  # bursts ran: a draft left behind each
    # Each later feed (if a try came) is right before a drafting round, never after a burst.
    for i in feeds:
        plain_after = next(j for j, e in enumerate(log[i:]) if isinstance(e, int) and e > 0)
        assert plain_after < PLAIN_BURST


def _round_periods(monkeypatch, decoder: Decoder) -> list[float]:  # type: ignore[no-untyped-def]
    """The seconds of every round's period ``decoder`` times, as it times them."""
    seen: list[float] = []
    observe = decoder.costs.observe_round

    def observe_round(k: int, width: int, seconds: float) -> None:
        seen.append(seconds)
        observe(k, width, seconds)

    monkeypatch.setattr(decoder.costs, "observe_round", observe_round)
    return seen


def test_a_round_that_waits_for_its_draft_prices_no_width(models, monkeypatch) -> None:
    import time

    pair = models["noisy"]
    decoder = Decoder(pair.target.model, pair.draft.model)
    real = Decoder._draft

    def draft(self, turns, timed, stacked, cutoff):  # type: ignore[no-untyped-def]
        out = real(self, turns, timed, stacked, cutoff)
        if timed:
            time.sleep(0.3)  # the sync after drafting, much exaggerated
        return out

    monkeypatch.setattr(Decoder, "_draft", draft)
    seen = _round_periods(monkeypatch, decoder)
    _, rounds = _tokens(decoder, PROMPT_IDS, 120, drafting=DraftSetting.of(3))
    assert sum(r.timed for r in rounds) >= 2 and sum(not r.timed and r.k > 0 for r in rounds) >= 8
    # Rounds of their shape do not sync: what one that did took is no sample of them.
    assert seen and max(seen) < 0.3


def test_a_probe_times_both_its_steps_where_queueing_runs_them(models, monkeypatch) -> None:
    """A backend may run a queued step inside async_eval: the probe's clock starts before it."""
    import time

    pair = models["copy"]
    decoder = Decoder(pair.target.model, pair.draft.model)
    seen: list[float] = []
    monkeypatch.setattr(decoder.costs, "observe_step", seen.append)
    real_eval = mx.eval

    def queued_runs(*args):  # type: ignore[no-untyped-def]
        real_eval(*args)
        time.sleep(0.05)  # each queued step takes 50 ms, before async_eval returns

    monkeypatch.setattr(mx, "async_eval", queued_runs)
    _tokens(decoder, PROMPT_IDS, 1 + 2 * PROBE, drafting=DraftSetting.of(3))  # a token, 2 probes
    assert seen and min(seen) >= 0.045


@pytest.mark.parametrize(
    ("target_ms", "draft_ms", "k", "oftener"),
    [(5, 0, 3, False), (0, 5, 3, False), (20, 16, None, True)],
)
def test_probes_come_oftener_only_where_auto_gains_little(
    models, monkeypatch, target_ms: int, draft_ms: int, k: int | None, oftener: bool
) -> None:
    import time

    pair = models["copy"]
    # A dear target: drafting 3 tokens gains about 3x. A dear draft: it loses. Both dear:
    # drafting 3 tokens gains about 1.15x.
    for model, ms in ((pair.target.model, target_ms), (pair.draft.model, draft_ms)):
        if ms:
            _before_forward(monkeypatch, model, lambda ms=ms: time.sleep(ms / 1000))
    decoder = Decoder(pair.target.model, pair.draft.model)
    _, rounds = _tokens(decoder, PROMPT_IDS, 320, drafting=DraftSetting.of(k, 3))
    drafting = [r for r in rounds if r.k]
    probes = len([r for r in rounds[1:] if not r.k]) / PROBE  # after the first token
    assert len(drafting) >= 64
    # Two at the start (a warm-up, then one that counts); then one in 64 rounds, or in 16
    # where Auto drafts for a small gain: a fixed k probes only for the gauge's baseline.
    assert probes >= 6 if oftener else probes <= 4, probes


def test_no_rounds_period_spans_two_replies(models, monkeypatch) -> None:
    import time

    pair = models["copy"]
    decoder = Decoder(pair.target.model, pair.draft.model, options=EngineOptions(probe_every=0))
    seen = _round_periods(monkeypatch, decoder)
    _tokens(decoder, PROMPT_IDS, 40, drafting=DraftSetting.of(3))
    time.sleep(0.5)  # the user reads the reply
    _tokens(
        decoder, PROMPT_IDS, 40, drafting=DraftSetting.of(3)
    )  # regenerated: its prompt is held whole
    # What a round costs is timed to the next round of its reply, never to the next reply.
    assert len(seen) >= 10 and max(seen) < 0.5


def test_the_baseline_leaves_out_the_cold_first_probe(models, monkeypatch) -> None:
    # What the probes time: the first runs cold (weights still paging in), 20x slower.
    timed = iter([10.0] + [0.5] * 20)

    class Paced(PlainPace):
        def token(self, now: float, behind: bool) -> float | None:
            step = super().token(now, behind)
            return None if step is None else next(timed)

    monkeypatch.setattr(spec, "PlainPace", Paced)
    pair = models["copy"]
    decoder = Decoder(pair.target.model, pair.draft.model)
    gen = decoder.generate(PROMPT_IDS, GenerationParams(drafting=DraftSetting.of(3)))
    next(gen)  # the prefill
    _round(gen)  # the first token, at plain latency
    for _ in range(PROBE):  # the cold probe's plain steps
        _round(gen)
    assert decoder.baseline_tps is None  # nothing honest to show a speedup against yet
    for _ in range(PROBE):  # the probe that counts
        _round(gen)
    gen.close()
    assert decoder.baseline_tps == pytest.approx(2.0)


def test_the_observer_hears_each_prompt_chunk_burst_and_round_as_it_ran(models) -> None:
    from app.engine.observe import (
        BatchStats,
        EngineEvent,
        PlainBurst,
        PrefillChunk,
        RoundRun,
        Totals,
    )

    pair = models["noisy"]
    decoder = Decoder(pair.target.model, pair.draft.model)
    heard: list[EngineEvent] = []
    totals = Totals()  # what /metrics counts, from the same events
    decoder.subscribe(heard.append)
    decoder.subscribe(totals)
    _, rounds = _tokens(decoder, PROMPT_IDS, 40, drafting=DraftSetting.of(3))
    counted = BatchStats(
        rounds=len(rounds),
        drafted=sum(r.k for r in rounds),
        accepted=sum(r.accepted for r in rounds),
        tokens=sum(len(r.tokens) for r in rounds),
        largest=1,
    )
    assert totals.snapshot() == counted and counted.drafted > 0
    assert sum(e.rows for e in heard if isinstance(e, PrefillChunk)) == len(PROMPT_IDS) - 1
    runs = [e for e in heard if isinstance(e, RoundRun)]
    drafted = [r for r in rounds if r.k]
    assert [(e.ks, e.accepted) for e in runs if any(e.ks)] == [
        ((r.k,), (r.accepted,)) for r in drafted
    ]
    # A fixed k bursts only to probe plain decoding for the baseline.
    assert all(e.tokens == PROBE for e in heard if isinstance(e, PlainBurst))
