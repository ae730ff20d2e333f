"""Batched speculative decoding: every request's reply is what it is alone."""

from __future__ import annotations

import threading
from collections.abc import Generator
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from app.engine import GenerationParams, load_pair
from app.engine import decoder as batch_module
from app.engine.batch_costs import BatchCosts, BatchProfile
from app.engine.costs import CostModel, CostProfile
from app.engine.decoder import IDLE_READ, PREFILL_CHUNK, Decoder, take_turns
from app.engine.observe import Totals
from app.engine.options import EngineOptions
from app.engine.rounds import DraftControl, DraftCutoff, Prefill, Round
from app.engine.sampling import log_probs
from app.engine.side_by_side import SideBySide
from app.engine.stacked import stacked_step
from app.engine.types import DraftSetting, Reading
from tests.conftest import TinyModels
from tests.engine.cases import CUTOFF_CASES

PROMPTS = [list(range(40, 80)), list(range(100, 112)), list(range(60, 70)) * 3, [7, 8, 9]]


@pytest.fixture(scope="module")
def pair(tiny: TinyModels):
    return load_pair(tiny.target, tiny.noisy)


def _solo(pair, prompt: list[int], n: int, **params) -> list[int]:
    gen = Decoder(pair.target.model).generate(
        prompt, GenerationParams(drafting=DraftSetting.of(0), **params)
    )
    out: list[int] = []
    for event in gen:
        if isinstance(event, Round):
            out += event.tokens
        if len(out) >= n:
            break
    gen.close()
    return out[:n]


def _counted(decoder: Decoder) -> Totals:
    """What ``decoder`` does from now on, counted from its events as ``/metrics`` counts it."""
    totals = Totals()
    decoder.subscribe(totals)
    return totals


def _turns(
    gens: list[Generator[Reading | Prefill | Round, None, None]], n: int
) -> tuple[list[list[int]], list[list[Round]]]:
    turns = take_turns(gens, n)
    return turns.replies, turns.rounds


@pytest.mark.parametrize(
    "params",
    [
        dict(drafting=DraftSetting.of(3)),
        dict(drafting=DraftSetting.of(None, 6)),
        dict(drafting=DraftSetting.of(2), repetition_penalty=1.3),
    ],
)
def test_each_greedy_reply_equals_its_solo_reply_with_caches_apart(pair, params) -> None:
    batch = Decoder(pair.target.model, pair.draft.model, options=EngineOptions(side_by_side=False))
    totals = _counted(batch)
    gens = [batch.generate(p, GenerationParams(**params)) for p in PROMPTS]
    got, rounds = _turns(gens, 40)
    rep = {k: v for k, v in params.items() if k.startswith("repetition")}
    assert got == [_solo(pair, p, 40, **rep) for p in PROMPTS]
    stats = totals.snapshot(batch.active)
    assert all(any(r.k for r in rs) for rs in rounds)  # every request drafted
    assert stats.largest == len(PROMPTS)  # the rounds were shared
    assert stats.drafted > stats.accepted > 0  # drafts were made, some rejected
    assert batch.active == 0  # closed requests left the batch


@pytest.mark.parametrize("drafts", [True, False])
def test_requests_with_prompt_lookup_share_rounds_and_each_stays_exact(pair, drafts) -> None:
    draft = pair.draft.model if drafts else None
    batch = Decoder(pair.target.model, draft)
    totals = _counted(batch)
    looked = GenerationParams(drafting=DraftSetting.of(4), prompt_lookup=True)
    # The repeating prompt gives lookup n-grams to propose; one request drafts without it.
    params = [looked, looked, GenerationParams(drafting=DraftSetting.of(3 if drafts else 0))]
    gens = [batch.generate(p, q) for p, q in zip(PROMPTS[1:], params, strict=True)]
    got, rounds = _turns(gens, 30)
    assert got == [_solo(pair, p, 30) for p in PROMPTS[1:]]
    assert totals.snapshot(batch.active).largest == 3  # the rounds were shared
    assert any(r.source.startswith("lookup") for rs in rounds[:2] for r in rs)  # it proposed


@pytest.mark.parametrize(
    "params", [dict(drafting=DraftSetting.of(3)), dict(drafting=DraftSetting.of(None, 6))]
)
def test_by_default_each_greedy_reply_equals_its_solo_reply_side_by_side(
    pair, params, monkeypatch
) -> None:
    laid: list[int] = []
    original = SideBySide.__init__

    def spy(self, caches, *args) -> None:
        laid.append(len(caches))
        original(self, caches, *args)

    monkeypatch.setattr(SideBySide, "__init__", spy)
    batch = Decoder(pair.target.model, pair.draft.model)
    totals = _counted(batch)
    gens = [batch.generate(p, GenerationParams(**params)) for p in PROMPTS]
    got, _ = _turns(gens, 40)
    assert got == [_solo(pair, p, 40) for p in PROMPTS]
    # Laid out once for the four; again only as requests left.
    assert laid[0] == len(PROMPTS) and len(laid) <= len(PROMPTS)
    assert totals.snapshot(batch.active).rounds > len(
        laid
    )  # the same stack served round after round


def test_side_by_side_keeps_its_stack_when_a_request_that_never_ran_leaves(
    pair, monkeypatch
) -> None:
    restored: list[int] = []
    original = SideBySide.restore

    def spy(self, caches) -> None:
        restored.append(len(caches))
        original(self, caches)

    monkeypatch.setattr(SideBySide, "restore", spy)
    batch = Decoder(pair.target.model, pair.draft.model, options=EngineOptions(side_by_side=True))
    params = GenerationParams(drafting=DraftSetting.of(3))
    _turns([batch.generate(p, params) for p in PROMPTS[:2]], 6)
    assert restored == [2]  # the first to finish gave both their caches back
    running = [batch.generate(p, params) for p in PROMPTS[:2]]
    for g in running:
        next(g), next(g)  # Prefill, then a round side by side
    cancel = threading.Event()
    batch.generate(PROMPTS[3], params, cancel=cancel)
    cancel.set()  # cancelled before it ever ran: it leaves as the next round starts
    for g in running:
        assert isinstance(next(g), Round)
    assert batch.active == 2
    assert restored == [2]  # the running pair kept its stack
    for g in running:
        g.close()
    assert restored == [2, 2]


def test_side_by_side_requests_join_leave_and_follow_up_exactly(pair) -> None:
    batch = Decoder(pair.target.model, pair.draft.model, options=EngineOptions(side_by_side=True))
    params = GenerationParams(drafting=DraftSetting.of(4))
    cancel = threading.Event()
    first = batch.generate(PROMPTS[0], params)
    stopped = batch.generate(PROMPTS[2], params, cancel=cancel)
    early: list[int] = []
    while len(early) < 12:  # rounds of the two, side by side
        event = next(first)
        early += event.tokens if isinstance(event, Round) else []
        next(stopped)
    cancel.set()
    assert list(stopped) == []  # it leaves; the other's cache comes back whole
    late = batch.generate(PROMPTS[1], params)
    got, _ = _turns([first, late], 30)
    assert early + got[0] == _solo(pair, PROMPTS[0], len(early) + 30)
    assert got[1] == _solo(pair, PROMPTS[1], 30)
    # A follow-up of the late request starts from its cache as it left the stack.
    follow_up = [*PROMPTS[1], *got[1], 7, 8, 9]
    gens = [batch.generate(follow_up, params), batch.generate(PROMPTS[3], params)]
    prefill = next(gens[0])
    assert isinstance(prefill, Prefill) and prefill.reused_tokens >= len(PROMPTS[1]) + 28
    again, _ = _turns(gens, 20)
    assert again == [_solo(pair, follow_up, 20), _solo(pair, PROMPTS[3], 20)]


def test_requests_join_and_leave_between_rounds(pair) -> None:
    batch = Decoder(pair.target.model, pair.draft.model)
    params = GenerationParams(drafting=DraftSetting.of(4))
    first = batch.generate(PROMPTS[0], params)
    early: list[int] = []
    while len(early) < 12:
        event = next(first)
        if isinstance(event, Round):
            early += event.tokens
    assert batch.active == 1
    late = batch.generate(PROMPTS[1], params)
    got, _ = _turns([first, late], 30)
    assert early + got[0] == _solo(pair, PROMPTS[0], len(early) + 30)
    assert got[1] == _solo(pair, PROMPTS[1], 30)


def test_a_long_prompt_is_read_a_chunk_per_round(pair) -> None:
    batch = Decoder(pair.target.model, pair.draft.model)
    params = GenerationParams(drafting=DraftSetting.of(2))
    running = batch.generate(PROMPTS[1], params)
    assert isinstance(next(running), Prefill)
    long_prompt = [20 + i % 300 for i in range(3 * PREFILL_CHUNK)] + [5]  # three chunks to read
    assert len(long_prompt) == 3 * PREFILL_CHUNK + 1
    joining = batch.generate(long_prompt, params)
    rounds_while_reading = 0
    # Each pull of the running request runs one round; the joiner reads a chunk then.
    for _ in range(3):
        assert isinstance(next(running), Round)
        rounds_while_reading += 1
    event = next(joining)
    assert isinstance(event, Prefill) and event.prompt_tokens == len(long_prompt)
    assert rounds_while_reading == 3
    got, _ = _turns([joining], 10)
    assert got[0] == _solo(pair, long_prompt, 10)


def test_requests_that_come_together_read_their_prompts_in_one_round(pair) -> None:
    batch = Decoder(pair.target.model, pair.draft.model)
    totals = _counted(batch)
    params = GenerationParams(drafting=DraftSetting.of(2))
    gens = [batch.generate(p, params) for p in PROMPTS]
    assert isinstance(next(gens[0]), Prefill)
    # The first pull read every prompt (under one chunk in all), so all start at once.
    assert all(isinstance(next(g), Prefill) for g in gens[1:])
    assert totals.snapshot(batch.active).rounds == 0
    for g in gens:
        assert isinstance(next(g), Round)
    assert totals.snapshot(batch.active).rounds == 1
    for g in gens:
        g.close()


def test_requests_that_come_to_an_idle_batch_start_together_past_one_chunk(pair) -> None:
    batch = Decoder(pair.target.model, pair.draft.model)
    totals = _counted(batch)
    params = GenerationParams(drafting=DraftSetting.of(2))
    prompts = [[30 + j + i % 50 for i in range(150)] for j in range(7)]
    assert PREFILL_CHUNK < sum(map(len, prompts)) <= IDLE_READ
    gens = [batch.generate(p, params) for p in prompts]
    assert all(isinstance(next(g), Prefill) for g in gens)  # one read took every prompt
    assert totals.snapshot(batch.active).rounds == 0
    got, rounds = _turns(gens, 8)
    assert totals.snapshot(batch.active).largest == len(
        prompts
    )  # the first round verified all of them
    # Each first token at plain latency, then drafting.
    assert all(rs[0].k == 0 and rs[1].k == 2 for rs in rounds)
    assert got == [_solo(pair, p, 8) for p in prompts]


SYSTEM = [20 + i % 37 for i in range(70)]  # a long shared start, as a team's system prompt


@pytest.mark.parametrize(
    "params",
    [
        GenerationParams(drafting=DraftSetting.of(3)),
        GenerationParams(drafting=DraftSetting.of(None, 6)),
        GenerationParams(drafting=DraftSetting.of(3), temperature=0.9, seed=4),
    ],
)
def test_requests_that_join_together_read_the_start_they_share_once(
    pair, params, monkeypatch
) -> None:
    prompts = [
        [*SYSTEM, 5, 6, 7, 8],
        [*SYSTEM, 9, 10],
        [*SYSTEM, 5, 6, 7, 8],  # the first one again, as a regenerated reply
        PROMPTS[1],  # shares nothing
        [*SYSTEM, *range(200, 240)],
    ]
    read: dict[int, int] = {}
    original = Decoder._read_into

    def spy(self, model, chunks, caches):  # type: ignore[no-untyped-def]
        if model is pair.target.model:
            for r, chunk in chunks:
                read[id(r)] = read.get(id(r), 0) + len(chunk)
        return original(self, model, chunks, caches)

    monkeypatch.setattr(Decoder, "_read_into", spy)
    batch = Decoder(pair.target.model, pair.draft.model)
    totals = _counted(batch)
    gens = [batch.generate(p, params) for p in prompts]
    prefills = [next(g) for g in gens]
    assert totals.snapshot(batch.active).rounds == 0  # one pull started all of them
    reused = [e.reused_tokens if isinstance(e, Prefill) else None for e in prefills]
    assert reused == [0, 70, 73, 0, 70]
    assert totals.snapshot(batch.active).shared == 70 + 73 + 70
    # The shared start was read once; each other request read only its own rest.
    assert sorted(read.values()) == sorted([73, 1, len(PROMPTS[1]) - 1, 39])
    got, _ = _turns(gens, 24)
    assert totals.snapshot(batch.active).largest == len(prompts)
    alone = [
        _turns([Decoder(pair.target.model, pair.draft.model).generate(p, params)], 24)[0][0]
        for p in prompts
    ]
    assert got == alone
    if params.temperature == 0:
        assert got == [_solo(pair, p, 24) for p in prompts]


@pytest.mark.parametrize("running", [1, 2])
def test_a_request_that_joins_copies_the_start_a_decoding_request_shares(
    pair, running, monkeypatch
) -> None:
    laid: list[SideBySide] = []
    original = SideBySide.__init__

    def spy(self, caches, *args) -> None:
        laid.append(self)
        original(self, caches, *args)

    monkeypatch.setattr(SideBySide, "__init__", spy)
    batch = Decoder(pair.target.model, pair.draft.model)
    # One request alone decodes plainly (its own cache, a step queued ahead); two
    # draft side by side, long enough that their stack compacts.
    params = GenerationParams(drafting=DraftSetting.of(0 if running == 1 else 3))
    # The joiner shares its start with the last of them only.
    prompts = [[*([60 + i % 29 for i in range(70)] if j else SYSTEM), 5, 6] for j in range(running)]
    prompts.reverse()
    gens = [batch.generate(p, params) for p in prompts]
    early: list[list[int]] = [[] for _ in gens]
    for _ in range(200):
        for g, out in zip(gens, early, strict=True):
            event = next(g)
            out += event.tokens if isinstance(event, Round) else []
        if early[0] and (running == 1 or (laid and laid[0].compactions)):
            break
    assert running == 1 or laid[0].compactions
    prompt = [*SYSTEM, 9, 10, 11]
    joining = batch.generate(prompt, GenerationParams(drafting=DraftSetting.of(3)))
    prefill = next(joining)
    assert isinstance(prefill, Prefill) and prefill.reused_tokens == len(SYSTEM)
    got, _ = _turns([*gens, joining], 20)
    assert got[-1] == _solo(pair, prompt, 20)
    for p, before, after in zip(prompts, early, got, strict=False):
        assert before + after == _solo(pair, p, len(before) + 20)


def test_another_conversation_copies_a_finished_one_s_start_and_leaves_it_its_caches(
    pair,
) -> None:
    batch = Decoder(pair.target.model, pair.draft.model)
    totals = _counted(batch)
    params = GenerationParams(drafting=DraftSetting.of(3))
    first = [*SYSTEM, 5, 6]
    reply = _turns([batch.generate(first, params)], 20)[0][0]
    # Another user's conversation with the same system prompt copies its rows...
    other = batch.generate([*SYSTEM, 9, 10], params)
    prefill = next(other)
    assert isinstance(prefill, Prefill) and prefill.reused_tokens == len(SYSTEM)
    assert _turns([other], 10)[0][0] == _solo(pair, [*SYSTEM, 9, 10], 10)
    assert totals.snapshot(batch.active).shared == len(SYSTEM)
    # ...and the first conversation's next turn still finds all of its own.
    follow_up = [*first, *reply, 7, 8]
    gen = batch.generate(follow_up, params)
    prefill = next(gen)
    assert isinstance(prefill, Prefill) and prefill.reused_tokens == len(first) + len(reply) - 1
    assert _turns([gen], 12)[0][0] == _solo(pair, follow_up, 12)


def test_a_follow_up_reads_only_what_the_finished_request_did_not_hold(pair) -> None:
    batch = Decoder(pair.target.model, pair.draft.model)
    params = GenerationParams(drafting=DraftSetting.of(3))
    first = batch.generate(PROMPTS[0], params)
    reply, _ = _turns([first], 20)
    follow_up = [*PROMPTS[0], *reply[0], 7, 8, 9]  # the next turn of the conversation
    gen = batch.generate(follow_up, params)
    prefill = next(gen)
    assert isinstance(prefill, Prefill)
    # The first request's caches held its prompt and all but its newest token.
    assert prefill.reused_tokens >= len(PROMPTS[0]) + 18
    got, _ = _turns([gen], 20)
    assert got[0] == _solo(pair, follow_up, 20)
    # A prompt the kept caches hold whole still gets its Prefill and the same reply.
    again = batch.generate(follow_up, params)
    assert isinstance(next(again), Prefill)
    assert _turns([again], 20)[0] == got
    # Forgotten, the kept caches give their memory back and serve nothing.
    assert batch.forget() > 0
    fresh = next(batch.generate(follow_up, params))
    assert isinstance(fresh, Prefill) and fresh.reused_tokens == 0


@pytest.mark.parametrize("side_by_side", [False, True])
def test_a_seeded_sampled_reply_is_the_same_whatever_runs_beside_it(pair, side_by_side) -> None:
    seeded = GenerationParams(drafting=DraftSetting.of(3), temperature=0.9, seed=11)
    alone, _ = _turns(
        [Decoder(pair.target.model, pair.draft.model).generate(PROMPTS[0], seeded)], 40
    )
    options = EngineOptions(side_by_side=side_by_side)
    batch = Decoder(pair.target.model, pair.draft.model, options=options)
    others = GenerationParams(
        drafting=DraftSetting.of(2), temperature=1.0
    )  # unseeded: the global state
    gens = [
        batch.generate(PROMPTS[1], others),
        batch.generate(PROMPTS[0], seeded),
        batch.generate(
            PROMPTS[2], GenerationParams(drafting=DraftSetting.of(4), temperature=0.7, seed=3)
        ),
    ]
    got, _ = _turns(gens, 40)
    assert got[1] == alone[0]
    assert got[2] != got[1]  # its own seed, its own draws


def test_a_request_closed_before_its_first_pull_leaves_the_batch(pair) -> None:
    batch = Decoder(pair.target.model, pair.draft.model)
    totals = _counted(batch)
    params = GenerationParams(drafting=DraftSetting.of(3))
    dropped = batch.generate(PROMPTS[0], params)
    going = batch.generate(PROMPTS[2], params)
    assert batch.active == 2
    dropped.close()  # never pulled: its rounds never started
    assert batch.active == 1
    got, _ = _turns([going], 20)
    assert got[0] == _solo(pair, PROMPTS[2], 20)
    assert totals.snapshot(batch.active).largest == 1  # no round carried the dropped request


def test_a_cancelled_request_ends_without_stopping_the_others(pair) -> None:
    batch = Decoder(pair.target.model, pair.draft.model)
    params = GenerationParams(drafting=DraftSetting.of(3))
    cancel = threading.Event()
    stopped = batch.generate(PROMPTS[0], params, cancel=cancel)
    going = batch.generate(PROMPTS[2], params)
    next(stopped), next(going)
    cancel.set()
    assert batch.active == 2
    assert list(stopped) == []
    assert batch.active == 1
    got, _ = _turns([going], 20)
    assert got[0] == _solo(pair, PROMPTS[2], 20)


def test_a_round_never_drafts_past_the_request_budget(pair) -> None:
    batch = Decoder(pair.target.model, pair.draft.model, options=EngineOptions(probe_every=0))
    gen = batch.generate(PROMPTS[1], GenerationParams(drafting=DraftSetting.of(8), max_tokens=5))
    first = next(e for e in gen if isinstance(e, Round))
    gen.close()
    assert first.k == 4  # five tokens: four drafts and the target's own


def test_auto_requests_together_draft_what_the_batch_costs_favour(pair) -> None:
    # Every width costs the same and a draft step next to nothing: the longest draft pays.
    flat = BatchProfile(verify=((2, (1.0,) * 17),), draft=((2, 1e-4),))
    single = CostModel(7, profile=CostProfile(verify=(1.0,) * 7, draft_step=1e-4))
    batch = Decoder(pair.target.model, pair.draft.model, single, BatchCosts(single, flat))
    params = GenerationParams(drafting=DraftSetting.of(None, 6), max_tokens=30)
    got, rounds = _turns([batch.generate(p, params) for p in PROMPTS[:2]], 30)
    assert got == [_solo(pair, p, 30) for p in PROMPTS[:2]]
    together = [r for r in rounds[0] if r.k][:4]  # the shortest reply ends last of all
    assert together and all(r.k == 6 and r.auto for r in together)
    # Each round's seconds are priced as one; nothing measured by them says otherwise yet.
    steep = BatchProfile(verify=((2, tuple(float(m) for m in range(1, 18))),), draft=((2, 0.5),))
    batch = Decoder(pair.target.model, pair.draft.model, single, BatchCosts(single, steep))
    _, rounds = _turns([batch.generate(p, params) for p in PROMPTS[:2]], 30)
    assert max(r.k for r in rounds[0][:4]) < 6


def test_the_batch_times_the_shapes_it_has_not_measured_and_stores_them(pair) -> None:
    stored: list[BatchProfile] = []
    single = CostModel(7)
    costs = BatchCosts(single, on_measured=stored.append)
    batch = Decoder(pair.target.model, pair.draft.model, single, costs)
    params = GenerationParams(drafting=DraftSetting.of(3))
    _turns([batch.generate(p, params) for p in PROMPTS[:2]], 24)
    assert costs.measured(2, 4) and costs.draft_step(2) is not None
    assert stored and dict(stored[-1].verify)[2][3] is not None  # 2 sequences of 4 rows


def test_the_batch_measures_its_draft_steps_stacked_and_packed_and_runs_the_cheaper(
    pair,
) -> None:
    batch = Decoder(pair.target.model, pair.draft.model)
    got, _ = _turns(
        [batch.generate(p, GenerationParams(drafting=DraftSetting.of(3))) for p in PROMPTS], 40
    )
    assert got == [_solo(pair, p, 40) for p in PROMPTS]
    learned = batch.batch_costs.profile()
    stacked, packed = dict(learned.stacked), dict(learned.draft)
    assert stacked.get(4) and packed.get(4)  # four requests drafted both ways
    assert batch.batch_costs.stacks(4) == (stacked[4] <= packed[4])


def test_a_stacked_draft_starts_with_what_each_request_committed(pair, monkeypatch) -> None:
    widths: list[int] = []
    real = stacked_step  # what batch calls until patched below

    def step(model, tokens, stack):
        if model is pair.draft.model:  # the target's verify runs side by side too
            widths.append(max(t.size for t in tokens))
        return real(model, tokens, stack)

    monkeypatch.setattr(batch_module, "stacked_step", step)
    batch = Decoder(pair.target.model, pair.draft.model)
    monkeypatch.setattr(batch.batch_costs, "stacks", lambda d: d > 1)  # every round stacked
    got, _ = _turns(
        [batch.generate(p, GenerationParams(drafting=DraftSetting.of(3))) for p in PROMPTS], 30
    )
    assert got == [_solo(pair, p, 30) for p in PROMPTS]
    # After a fully accepted draft a request feeds two tokens: its last draft and the bonus.
    assert max(widths) == 2 and widths.count(1) > widths.count(2)


def test_a_round_where_one_request_drafts_on_alone_does_not_bar_stacking(pair) -> None:
    batch = Decoder(pair.target.model, pair.draft.model)
    # From the second draft step only the first request still drafts: nothing to stack.
    gens = [
        batch.generate([7], GenerationParams(drafting=DraftSetting.of(3))),
        batch.generate(PROMPTS[0], GenerationParams(drafting=DraftSetting.of(1))),
    ]
    assert all(isinstance(next(gen), Prefill) for gen in gens)  # both join the first round
    firsts = [next(e for e in gen if isinstance(e, Round)) for gen in gens]
    assert [r.k for r in firsts] == [0, 0]  # each first token at plain latency
    rounds = [next(e for e in gen if isinstance(e, Round)) for gen in gens]
    assert [r.k for r in rounds] == [3, 1]
    assert batch.batch_costs.stacks(2)
    for gen in gens:
        gen.close()


def test_requests_too_ragged_to_stack_draft_packed_and_stay_exact(pair) -> None:
    prompts = [list(range(40, 240)), [7, 8, 9], [11, 12, 13], [15, 16, 17]]
    batch = Decoder(pair.target.model, pair.draft.model)
    got, _ = _turns(
        [batch.generate(p, GenerationParams(drafting=DraftSetting.of(3))) for p in prompts], 12
    )
    assert got == [_solo(pair, p, 12) for p in prompts]
    assert not batch.batch_costs.stacks(4)  # the long prompt would pad the stack past SLACK
    assert 4 in dict(batch.batch_costs.profile().draft)  # so it drafted packed


def test_requests_together_teach_the_acceptance_a_lone_reply_plans_with(pair) -> None:
    decoder = Decoder(pair.target.model, pair.draft.model)
    _turns(
        [decoder.generate(p, GenerationParams(drafting=DraftSetting.of(3))) for p in PROMPTS[:2]],
        12,
    )
    assert decoder.acceptance(False).evidence > 0  # what the batch saw, a lone reply plans with
    assert decoder.acceptance(True).evidence == 0  # sampled replies keep their own


def _exact(model, prompt: list[int], params: GenerationParams) -> np.ndarray:
    logits = model(mx.array(prompt)[None])[0, -1:].astype(mx.float32)
    return np.array(mx.exp(log_probs(logits, params))[0], dtype=np.float64)


def _chi_square(counts: np.ndarray, p: np.ndarray) -> tuple[float, float]:
    """The statistic over tokens of p above 1 % (the rest pooled), and a critical value."""
    seen = p > 0.01
    expected = counts.sum() * p[seen]
    rest = counts.sum() * p[~seen].sum()
    stat = ((counts[seen] - expected) ** 2 / expected).sum()
    stat += (counts[~seen].sum() - rest) ** 2 / max(rest, 1e-9)
    dof = int(seen.sum())
    return float(stat), dof + 4 * float(np.sqrt(2 * dof))


def test_sampled_first_token_keeps_the_target_distribution(pair) -> None:
    """Chi-square of the first token of concurrent sampled requests against p."""
    params = GenerationParams(drafting=DraftSetting.of(3), temperature=0.8)
    prompt = PROMPTS[0][:20]
    counts = np.zeros(pair.target.config["vocab_size"])
    batch = Decoder(pair.target.model, pair.draft.model)
    for r in range(60):  # each request its own seed: independent draws, the same every run
        gens = [batch.generate(prompt, replace(params, seed=10 * r + j)) for j in range(10)]
        for gen in gens:
            first = next(e for e in gen if isinstance(e, Round))
            counts[first.tokens[0]] += 1
        for gen in gens:
            gen.close()
    p = _exact(pair.target.model, prompt, params)
    stat, critical = _chi_square(counts, p)
    assert stat < critical, (stat, critical)
    # Power: samples from the draft's own distribution would fail the same test.
    q = _exact(pair.draft.model, prompt, params)
    assert _chi_square(counts.sum() * q, p)[0] > critical


@pytest.mark.parametrize("stretch", [True, False])
def test_a_lone_auto_request_plans_along_stretches_and_stays_exact(stretch: bool) -> None:
    from app.testing import synthetic as syn

    target, draft = syn.build("tiny"), syn.build("tiny", miss=0.1, seed=1)
    prompt = syn.prompt("tiny")
    batch = Decoder(target, draft, options=EngineOptions(stretch=stretch))
    gen = batch.generate(prompt, GenerationParams(drafting=DraftSetting.of(None, 12)))
    (got,), (rounds,) = _turns([gen], 120)
    assert got == [syn.CYCLE_START + i % 64 for i in range(len(prompt), len(prompt) + 120)]
    assert any(r.k for r in rounds)
    # The request's rounds taught the table by distance from a stretch's start:
    # unseen distances would all lean on the pooled rate.
    assert (len(set(batch.acceptance(False).stretch_rates())) > 1) is stretch


def _cutting(pair, setting: bool | None) -> Decoder:
    """A batch whose draft step costs half a forward: unsure drafts are worth ending."""
    single = CostModel(7, profile=CostProfile(verify=(1.0,) * 7, draft_step=0.5))
    flat = BatchProfile(verify=((2, (1.0,) * 17),), draft=((2, 0.5),))
    batch = Decoder(
        pair.target.model,
        pair.draft.model,
        single,
        BatchCosts(single, flat),
        options=EngineOptions(draft_cutoff=setting),
    )
    return batch


def test_a_batched_draft_cut_short_when_unsure_keeps_greedy_exact(pair) -> None:
    batch = _cutting(pair, True)
    params = GenerationParams(
        drafting=DraftSetting.of(6)
    )  # its budget leaves room for 6 in every round
    got, rounds = _turns([batch.generate(p, params) for p in PROMPTS[:3]], 40)
    assert got == [_solo(pair, p, 40) for p in PROMPTS[:3]]
    assert any(0 < r.k < 6 for rs in rounds for r in rs)


@pytest.mark.parametrize(("setting", "temperature", "num_draft", "cuts"), CUTOFF_CASES)
def test_batched_drafts_end_early_only_where_the_cutoff_is_asked_or_measured_to_pay(
    pair, monkeypatch, setting, temperature, num_draft, cuts
) -> None:
    stops: list[float] = []

    class Spy(DraftCutoff):
        def __post_init__(self) -> None:
            stops.extend(self.stops)
            super().__post_init__()

    monkeypatch.setattr(batch_module, "DraftCutoff", Spy)
    batch = _cutting(pair, setting)
    drafting = DraftSetting.of(num_draft, 6)
    params = GenerationParams(drafting=drafting, temperature=temperature, seed=3, max_tokens=30)
    _turns([batch.generate(p, params) for p in PROMPTS[:2]], 30)
    assert stops  # rounds ran
    assert any(s > 0 for s in stops) is cuts


def test_a_round_of_several_requests_fades_their_acceptance_once(pair, monkeypatch) -> None:
    from app.engine.adaptive import Acceptance

    shares: list[float] = []
    real = Acceptance.observe

    def spy(self: Acceptance, k: int, accepted: int, share: float = 1.0) -> None:
        shares.append(share)
        real(self, k, accepted, share)

    monkeypatch.setattr(Acceptance, "observe", spy)
    batch = Decoder(pair.target.model, pair.draft.model)
    gens = [batch.generate(p, GenerationParams(drafting=DraftSetting.of(3))) for p in PROMPTS]
    assert all(isinstance(next(g), Prefill) for g in gens)
    for g in gens:
        assert next(e for e in g if isinstance(e, Round)).k == 0  # the first tokens, plainly
    assert shares == []
    next(e for e in gens[0] if isinstance(e, Round))  # one drafting round for all four
    assert shares == [0.25] * 4
    shares.clear()
    alone = Decoder(pair.target.model, pair.draft.model).generate(
        PROMPTS[0], GenerationParams(drafting=DraftSetting.of(3))
    )
    next(e for e in alone if isinstance(e, Round) and e.k)
    assert shares == [1.0]


def _pull(gen, n: int) -> list[int]:
    out: list[int] = []
    while len(out) < n:
        event = next(gen)
        if isinstance(event, Round):
            out += event.tokens
    return out


def _slow() -> CostModel:
    """Costs whose stored plain step is far slower than any here: only timed steps replace it."""
    return CostModel(9, CostProfile(verify=(10.0,) * 9, draft_step=0.001))


def _timed_plain(costs: CostModel) -> bool:
    """Whether plain steps were timed since :func:`_slow` (its stored step replaced)."""
    step = costs.profile().verify[0]
    return step is not None and step < 1.0


@pytest.mark.parametrize("params", [dict(), dict(repetition_penalty=1.3)])
def test_a_lone_request_that_drafts_nothing_decodes_a_step_ahead_exactly(pair, params) -> None:
    costs = _slow()
    batch = Decoder(pair.target.model, pair.draft.model, costs)
    totals = _counted(batch)
    got, rounds = _turns(
        [batch.generate(PROMPTS[0], GenerationParams(drafting=DraftSetting.of(0), **params))], 30
    )
    assert got[0] == _solo(pair, PROMPTS[0], 30, **params)
    assert all(r.k == 0 and len(r.tokens) == 1 for r in rounds[0])
    # Its steps ran pipelined, one queued ahead, and priced the pair's plain step.
    assert _timed_plain(costs)
    assert totals.snapshot(batch.active).tokens == 30


@pytest.mark.parametrize(
    "params",
    [dict(drafting=DraftSetting.of(0)), dict(drafting=DraftSetting.of(0), temperature=0.9, seed=5)],
)
def test_a_request_joining_a_plain_burst_ends_it_and_every_reply_stays_exact(pair, params) -> None:
    plain = GenerationParams(**params)
    alone, _ = _turns(
        [Decoder(pair.target.model, pair.draft.model).generate(PROMPTS[0], plain)], 40
    )
    costs = _slow()
    batch = Decoder(pair.target.model, pair.draft.model, costs)
    totals = _counted(batch)
    first = batch.generate(PROMPTS[0], plain)
    early = _pull(first, 12)
    assert _timed_plain(costs)  # it was decoding plainly, pipelined
    late = batch.generate(PROMPTS[1], GenerationParams(drafting=DraftSetting.of(4)))
    got, rounds = _turns([first, late], 40 - len(early))
    assert early + got[0] == alone[0]
    assert got[1] == _solo(pair, PROMPTS[1], len(got[1]))
    assert any(r.k for r in rounds[1])  # the joiner drafted beside the plain request
    assert (
        totals.snapshot(batch.active).largest == 2
    )  # and their rounds were shared after the burst
    if params.get("temperature", 0) == 0:
        assert alone[0] == _solo(pair, PROMPTS[0], 40)


def test_drafting_asked_for_mid_burst_ends_it_and_the_reply_stays_exact(pair) -> None:
    control = DraftControl(DraftSetting.fixed(0))
    costs = _slow()
    batch = Decoder(pair.target.model, pair.draft.model, costs)
    gen = batch.generate(PROMPTS[2], GenerationParams(drafting=DraftSetting.of(0)), control=control)
    early = _pull(gen, 10)
    assert _timed_plain(costs)  # it was decoding plainly, pipelined
    control.set(DraftSetting.fixed(3))
    got, rounds = _turns([gen], 30)
    assert early + got[0] == _solo(pair, PROMPTS[2], len(early) + 30)
    assert any(r.k == 3 for r in rounds[0])


def test_a_request_closed_mid_burst_leaves_caches_a_follow_up_reuses_exactly(pair) -> None:
    costs = _slow()
    batch = Decoder(pair.target.model, costs=costs)  # the target's cache alone is reused
    params = GenerationParams(drafting=DraftSetting.of(0))
    gen = batch.generate(PROMPTS[0], params)
    reply = _pull(gen, 15)
    assert _timed_plain(costs)  # it was decoding plainly, pipelined
    gen.close()  # a step was queued past the last token it handed out
    assert batch.active == 0
    follow_up = [*PROMPTS[0], *reply, 7, 8, 9]
    again = batch.generate(follow_up, params)
    prefill = next(again)
    assert isinstance(prefill, Prefill) and prefill.reused_tokens >= len(PROMPTS[0]) + 14
    got, _ = _turns([again], 20)
    assert got[0] == _solo(pair, follow_up, 20)


def test_a_lone_auto_request_probes_plain_steps_and_decodes_plainly_where_drafts_cost_more(
    pair,
) -> None:
    # Stored costs: a plain step and every verification 10 s, so only the probe's timed
    # plain steps show that plain decoding is far cheaper than any drafting round here.
    costs = _slow()
    batch = Decoder(pair.target.model, pair.draft.model, costs)
    gen = batch.generate(
        PROMPTS[0], GenerationParams(drafting=DraftSetting.of(None, 8), max_tokens=80)
    )
    got, rounds = _turns([gen], 80)
    assert got[0] == _solo(pair, PROMPTS[0], 80)
    assert _timed_plain(costs)
    # Not even drafts all accepted would pay once the probe timed a plain step: Auto
    # decodes plainly without waiting to learn its acceptance.
    assert all(r.k == 0 for r in rounds[0])
