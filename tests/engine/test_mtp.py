"""A target's multi-token-prediction head: wired as the reference, loaded where it is stored."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from app.engine.decoder import Decoder, take_turns
from app.engine.loader import config_model
from app.engine.mtp import (
    HiddenRows,
    MTPDraft,
    MTPHead,
    embed,
    has_head,
    head_problem,
    head_weights,
    hidden_and_logits,
    load_head,
    logits,
    text_model,
)
from app.engine.rounds import Prefill, Round
from app.engine.types import DraftSetting, GenerationParams, Origin
from app.errors import ModelError
from tests.engine.families import hybrid_config

GOLDEN = Path(__file__).parent / "data" / "mtp_golden.safetensors"


def _golden() -> tuple[dict[str, mx.array], Any]:
    arrays, meta = cast(
        tuple[dict[str, mx.array], dict[str, str]], mx.load(str(GOLDEN), return_metadata=True)
    )
    text = json.loads(meta["text_config"])
    target = config_model({"model_type": "qwen3_5", "text_config": text})
    inner = text_model(target)
    inner.model.embed_tokens.weight = arrays["embed_tokens.weight"]
    inner.lm_head.weight = arrays["lm_head.weight"]
    return arrays, target


def test_the_heads_logits_are_mlx_vlms_at_depth_one_and_chained() -> None:
    """Golden values from mlx-vlm 0.7.10's Qwen3.5 MTP drafter (tools/mtp_golden.py)."""
    arrays, target = _golden()
    head = MTPHead(target)
    weights = {k.removeprefix("head."): v for k, v in arrays.items() if k.startswith("head.")}
    head.load_weights(list(weights.items()), strict=True)
    cache = head.make_cache()
    tokens, hidden = arrays["tokens"], arrays["hidden"]
    states = head(embed(target, tokens), hidden, cache)
    assert mx.allclose(logits(target, states), arrays["depth1"], atol=1e-4)
    state, token, chained = states[:, -1:], mx.argmax(arrays["depth1"][:, -1:], axis=-1), []
    for _ in range(3):  # each step fed its own output and its own greedy token
        state = head(embed(target, token), state, cache)
        chained.append(logits(target, state))
        token = mx.argmax(chained[-1], axis=-1)
    assert mx.allclose(mx.concatenate(chained, axis=1), arrays["chained"], atol=1e-4)


@pytest.fixture(scope="module")
def target() -> Any:
    """A tiny Qwen3.5 target whose final norm is far from one, so that using it shows."""
    model = config_model(hybrid_config("qwen3_5"))
    inner = text_model(model).model
    mx.random.seed(3)
    inner.norm.weight = mx.random.uniform(0.2, 3.0, inner.norm.weight.shape)
    mx.eval(model.parameters())
    return model


def _wired(target: Any, hidden_first: bool = False) -> dict[str, mx.array]:
    """A head that passes the hidden state through: fc takes the hidden half as it is, its
    layer adds nothing. It predicts what the target itself predicts from that state."""
    head = MTPHead(target)
    size = head.norm.weight.shape[0]
    eye, zero = mx.eye(size), mx.zeros((size, size))
    weights = dict(cast(list[tuple[str, mx.array]], tree_flatten(head.parameters())))
    weights["fc.weight"] = mx.concatenate([eye, zero] if hidden_first else [zero, eye], axis=1)
    weights["layers.0.self_attn.o_proj.weight"] = mx.zeros((size, size))
    down = "layers.0.mlp.down_proj.weight"
    weights[down] = mx.zeros(weights[down].shape)
    return weights


def _save(folder: Path, target: Any, weights: dict[str, mx.array], hf: bool) -> dict[str, Any]:
    """A model folder of the target's config with an MTP head; ``hf``: Hugging Face's layout."""
    folder.mkdir()
    config = hybrid_config("qwen3_5")
    config["text_config"]["mtp_num_hidden_layers"] = 1
    (folder / "config.json").write_text(json.dumps(config))
    stored = {
        f"mtp.{k}": v - 1.0 if hf and k.endswith("norm.weight") else v for k, v in weights.items()
    }
    conv = (16, 1, 4) if hf else (16, 4, 1)  # a convolution as stored: how mlx-lm tells
    stored["model.language_model.layers.0.linear_attn.conv1d.weight"] = mx.zeros(conv)
    mx.save_safetensors(str(folder / "model.safetensors"), stored)
    return config


def _predicts(target: Any, head: MTPHead, hidden: mx.array, tokens: mx.array) -> mx.array:
    states = head(embed(target, tokens), hidden, head.make_cache())
    return mx.argmax(logits(target, states), axis=-1)


@pytest.mark.parametrize("hf", [True, False], ids=["hugging-face", "mlx"])
def test_a_hand_wired_head_predicts_right_only_when_wired_as_the_reference(
    target, tmp_path: Path, hf: bool
) -> None:
    config = _save(tmp_path / "model", target, _wired(target), hf)
    head = load_head(tmp_path / "model", target, config)
    tokens = mx.array([[3, 9, 27, 81, 243, 100, 7, 50]])
    cache = [None] * len(text_model(target).model.layers)
    hidden, want = hidden_and_logits(target, tokens, cache)
    assert mx.array_equal(_predicts(target, head, hidden, tokens), mx.argmax(want, axis=-1))
    # The hidden state before the final norm, or the halves of fc's input swapped, miss.
    before = hidden / text_model(target).model.norm.weight
    assert not mx.array_equal(_predicts(target, head, before, tokens), mx.argmax(want, axis=-1))
    swapped = MTPHead(target)
    swapped.load_weights(list(_wired(target, hidden_first=True).items()))
    assert not mx.array_equal(_predicts(target, swapped, hidden, tokens), mx.argmax(want, axis=-1))


def test_norms_are_read_as_applied_in_either_layout(target, tmp_path: Path) -> None:
    weights = _wired(target)
    _save(tmp_path / "hf", target, weights, hf=True)
    _save(tmp_path / "mlx", target, weights, hf=False)
    for folder in ("hf", "mlx"):
        got = head_weights(tmp_path / folder)
        assert mx.array_equal(got["norm.weight"], weights["norm.weight"])
        assert set(got) == set(weights)


def test_a_target_without_a_head_says_so_in_one_line(target, tmp_path: Path) -> None:
    # As mlx-lm's converter leaves a Qwen3.5: the config names the head, the weights drop it.
    config = _save(tmp_path / "model", target, {}, hf=True)
    dropped = (
        "model's weights leave out the MTP head its config names; `tandem models import` "
        "of its Hugging Face checkpoint keeps it"
    )
    assert head_problem(tmp_path / "model") == dropped
    assert not has_head(tmp_path / "model")
    with pytest.raises(ModelError) as caught:
        load_head(tmp_path / "model", target, config)
    assert str(caught.value) == dropped
    with pytest.raises(ModelError) as caught:
        load_head(tmp_path / "model", target, {**config, "model_type": "mimo_v2"})
    assert str(caught.value) == (
        "model: Tandem drafts with the MTP heads of Qwen3.5 / 3.6, Qwen3-Next, "
        "GLM-4.5 / 4.6 / 4.7 / 4.7-Flash / 5, DeepSeek-V3 / V3.2, MiMo, MiMo-V2-Flash, "
        "Nemotron-H, not mimo_v2's"
    )
    _save(tmp_path / "whole", target, _wired(target), hf=True)
    assert has_head(tmp_path / "whole") and head_problem(tmp_path / "whole") is None


# The head as the engine's drafter: it proposes, the target decides.


@pytest.fixture(scope="module")
def drafter(target) -> Any:
    """A tiny Qwen3.5 target with an MTP head of random weights, its forward keeping its states."""
    from app.engine.recurrent import install

    install(target)
    mx.random.seed(11)
    head = MTPHead(target)
    mx.eval(head.parameters())
    return MTPDraft(target, head)


def _plain(target: Any, prompt: list[int], n: int) -> list[int]:
    from mlx_lm.generate import generate_step

    return [int(t) for t, _ in generate_step(mx.array(prompt), target, max_tokens=n)]


PROMPTS = ([3, 9, 27, 81, 243, 100, 7, 50], [5, 6, 7] * 30, [11, 12])


@pytest.mark.parametrize("k", [1, 4, 16, None], ids=["k1", "k4", "k16", "auto"])
def test_a_reply_drafted_by_the_head_is_the_targets_greedy_reply(target, drafter, k) -> None:
    decoder = Decoder(target, drafter)
    params = GenerationParams(temperature=0, drafting=DraftSetting.of(k))
    for prompt in PROMPTS[:2]:
        turns = take_turns([decoder.generate(prompt, params)], 24)
        assert turns.replies[0][:24] == _plain(target, prompt, 24)
        assert k is None or sum(r.k for r in turns.rounds[0]) > 0  # it drafted


def test_requests_drafted_by_their_heads_in_one_batch_are_exact(monkeypatch) -> None:
    from app.engine import merged
    from app.testing import synthetic as syn

    # A synthetic target and head: the head drafts the target's cycle but for a quarter
    # of positions at depth 1, and more from depth 2.
    target = syn.build("tiny-hybrid-wide", bits=4)
    head = syn.build_head(target, "tiny-hybrid-wide", miss=0.25, bits=4)
    cycle = syn.prompt("tiny-hybrid-wide")
    prompts = [cycle[i : i + 70] for i in (0, 9, 30)]
    steps = _sizes(monkeypatch, merged, "_heads_forward")
    decoder = Decoder(target, head)
    gens = [decoder.generate(p, _greedy(k)) for p, k in zip(prompts, (4, 2, 6), strict=True)]
    turns = take_turns(gens, 40)
    for prompt, reply in zip(prompts, turns.replies, strict=True):
        assert reply[:40] == _plain(target, prompt, 40)
    assert steps and max(steps) == 3  # the three heads stepped together
    rounds = [r for rs in turns.rounds for r in rs]
    assert sum(r.accepted for r in rounds) > 0.25 * sum(r.k for r in rounds)  # it drafts usefully
    # Its accepted tokens show as the head's, not a draft model's.
    origins = {o for r in rounds for o in r.origins}
    assert Origin.MTP in origins and Origin.DRAFT not in origins


def test_heads_stepped_together_draft_what_each_drafts_alone() -> None:
    from app.engine.caches import new_cache
    from app.engine.merged import joint_forward
    from app.engine.mtp import link
    from app.testing import synthetic as syn

    target = syn.build("tiny-hybrid-wide", bits=4)
    head = syn.build_head(target, "tiny-hybrid-wide", miss=0.25, bits=4)
    cycle = syn.prompt("tiny-hybrid-wide")
    prompts = [cycle[i : i + n] for i, n in ((0, 40), (9, 33), (30, 38))]

    def ready() -> list[list[Any]]:
        """Each request's head cache after its prompt but its last token, linked."""
        caches = []
        for p in prompts:
            t_cache = [*new_cache(target), HiddenRows()]
            target(mx.array([p]), cache=t_cache)
            d_cache = head.make_cache()
            link(d_cache, t_cache)
            head(mx.array([p[:-1]]), cache=d_cache)
            caches.append(d_cache)
        return caches

    apart, together = ready(), ready()
    last = [mx.array(p[-1:]) for p in prompts]
    for _ in range(3):  # the prompt's last token, then two drafted ones (the head's own states)
        want = [head(t[None], cache=c) for t, c in zip(last, apart, strict=True)]
        got = joint_forward(head, last, together)
        assert got is not None
        for w, g in zip(want, got, strict=True):
            assert mx.allclose(w, g, atol=1e-4)
        last = [mx.argmax(w[0, -1:], axis=-1) for w in want]
    assert [c[0].offset for c in together] == [c[0].offset for c in apart]


def _sizes(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """How many sequences each call of ``module.name`` (a joint forward) ran, from now on."""
    sizes: list[int] = []
    real = getattr(module, name)

    def counted(model, tokens, caches):  # type: ignore[no-untyped-def]
        sizes.append(len(tokens))
        return real(model, tokens, caches)

    monkeypatch.setattr(module, name, counted)
    return sizes


def _greedy(k: int) -> GenerationParams:
    return GenerationParams(temperature=0, drafting=DraftSetting.of(k))


def test_requests_verified_in_one_merged_forward_keep_their_own_states(
    target, drafter, monkeypatch
) -> None:
    from app.engine import merged

    runs = _sizes(monkeypatch, merged, "merged_forward")
    decoder = Decoder(target, drafter)
    prompts = [PROMPTS[0], PROMPTS[0][::-1], [4, 8, 15, 16, 23, 42, 7, 1]]
    params = GenerationParams(temperature=0, drafting=DraftSetting.of(3))
    turns = take_turns([decoder.generate(p, params) for p in prompts], 20)
    for prompt, reply in zip(prompts, turns.replies, strict=True):
        assert reply[:20] == _plain(target, prompt, 20)
    assert 3 in runs  # the target's forwards of all three, their states split back


def test_the_head_reads_the_targets_states_for_what_the_target_has_read(target, drafter) -> None:
    decoder = Decoder(target, drafter)
    gen = decoder.generate(PROMPTS[0], GenerationParams(drafting=DraftSetting.of(4)))
    seen: list[tuple[int, int]] = []
    real = HiddenRows.take

    def spy(self, start, stop, like):  # type: ignore[no-untyped-def]
        seen.append((start, self.offset))
        assert start < 0 or start >= self.offset - self.kept  # kept, not let go
        return real(self, start, stop, like)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(HiddenRows, "take", spy)
        take_turns([gen], 16)
    # Every state the head asked the target for was one the target had made.
    assert seen and all(start < offset for start, offset in seen)


def test_sampling_with_the_head_runs_and_keeps_to_the_vocabulary(target, drafter) -> None:
    decoder = Decoder(target, drafter)
    params = GenerationParams(temperature=0.8, seed=2, drafting=DraftSetting.of(4))
    turns = take_turns([decoder.generate(PROMPTS[0], params)], 24)
    assert len(turns.replies[0]) >= 24
    assert all(0 <= t < 384 for t in turns.replies[0])


def test_tune_sweeps_the_heads_depth_as_a_drafts_k(tiny_models_dir: Path) -> None:
    from app.engine.calibrate import CalibrationResult, calibrate
    from app.engine.loader import MTP, load_pair

    pair = load_pair(tiny_models_dir, MTP)
    assert pair.draft is not None and isinstance(pair.draft.model, MTPDraft)
    *_, result = calibrate(pair, ["Hi", "Name three colours."], [0, 2, 4], max_tokens=12)
    assert isinstance(result, CalibrationResult)
    assert len({p.tokens for p in result.points}) == 1  # greedy: every depth the same reply
    assert result.profile is not None and result.profile.draft_step  # the head's step, measured


@pytest.fixture
def tiny_models_dir(tiny, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    """A tiny Qwen3.5 target folder whose checkpoint carries an MTP head."""
    from tests.engine.families import mtp_model

    return mtp_model(tmp_path / "qwen3.5-tiny", tiny.target)


def test_a_follow_up_a_retry_and_an_edit_drafted_by_the_head_reuse_the_caches() -> None:
    from app.testing import synthetic as syn

    target = syn.build("tiny-hybrid-wide", bits=4)
    head = syn.build_head(target, "tiny-hybrid-wide", miss=0.25, bits=4)
    cycle = syn.prompt("tiny-hybrid-wide")
    decoder = Decoder(target, head)
    first = cycle[:40]
    reply = take_turns([decoder.generate(first, _greedy(4))], 24).replies[0][:24]
    follow = [*first, *reply, *cycle[3:9]]
    edited = [*first, *reply, *cycle[20:23]]
    # A turn, its retry, an edit of it; the last with prompt lookup beside the head.
    lookup = GenerationParams(drafting=DraftSetting.of(None), prompt_lookup=True)
    for prompt, params in ((follow, _greedy(4)), (follow, _greedy(6)), (edited, lookup)):
        gen = decoder.generate(prompt, params)
        prefill = next(e for e in gen if isinstance(e, Prefill))
        rounds: list[Round] = []
        while sum(len(r.tokens) for r in rounds) < 24:
            if isinstance(event := next(gen), Round):
                rounds.append(event)
        gen.close()  # as a reply that ends: its caches are kept for the next turn
        tokens = [t for r in rounds for t in r.tokens][:24]
        assert tokens == _plain(target, prompt, 24)
        # Not read again: the first prompt (an edit goes back to the state marked there).
        assert prefill.reused_tokens >= len(first) - 1
        assert sum(r.accepted for r in rounds) > 0  # the head drafted


def test_a_sampled_token_drafted_by_the_head_has_the_targets_distribution(target, drafter) -> None:
    """Chi-square of the reply's first token, which the head drafts (from the prompt's last
    token and the state before it), against the target's exact distribution."""
    import numpy as np

    from app.engine.options import EngineOptions
    from app.engine.sampling import log_probs
    from tests.fakes import chi_square

    prompt = PROMPTS[0]
    params = GenerationParams(temperature=0.5, drafting=DraftSetting.of(3))
    decoder = Decoder(target, drafter, options=EngineOptions(probe_every=0))  # it drafts
    n, rejected = 1200, 0
    counts = np.zeros(384)
    for i in range(n):  # each request its own seed: independent draws, the same every run
        gen = decoder.generate(prompt, replace(params, seed=i))
        first = next(e for e in gen if not isinstance(e, Prefill))
        gen.close()
        assert isinstance(first, Round) and first.k  # the head drafted it
        counts[first.tokens[0]] += 1
        rejected += first.accepted == 0
    assert rejected > n // 10  # the residual path is exercised
    tokens = mx.array(prompt)[None]
    hidden, out = hidden_and_logits(target, tokens, target.make_cache())
    states = drafter.head(embed(target, tokens[:, 1:]), hidden[:, :-1], drafter.head.make_cache())
    p, q = (
        np.array(mx.exp(log_probs(x[0, -1:].astype(mx.float32), params))[0], dtype=np.float64)
        for x in (out, logits(target, states))
    )
    stat, critical = chi_square(counts, p)
    assert stat < critical, (stat, critical)
    # Power: samples from the head's own distribution would fail the same test by far.
    assert chi_square(n * q, p)[0] > 5 * critical
