"""Several requests decoded at once on one :class:`~app.engine.decoder.Decoder`.

``tandem bench --concurrent 1,2,4,8`` measures it: for each stream count n it
opens n requests on one fresh batch, pulls them in turn (round robin on one
thread, as the engine thread serves them) until each has ``max_tokens``
tokens, and times the whole. The totals are set against one request alone,
decoded plainly and speculatively, and every greedy stream is checked token
for token against the target's own reply to its prompt.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, replace

import mlx.nn as nn

from app.bench import trace
from app.engine.batch_costs import BatchCosts
from app.engine.costs import CostModel, CostProfile
from app.engine.decoder import Decoder, Turns, take_turns
from app.engine.options import DEFAULT_OPTIONS, EngineOptions
from app.engine.types import DraftSetting, GenerationParams

STREAMS = (1, 2, 4, 8)

Replies = MutableMapping[tuple[int, ...], list[int]]  # a prompt's greedy reply, by prompt


@dataclass(frozen=True, slots=True)
class StreamsRow:
    """``streams`` requests decoded together, against one request alone.

    Attributes:
        streams: Requests open at once.
        k: The streams' draft length (``"auto"`` where Auto chose it).
        temp: Their temperature.
        total_tps: Tokens of all streams over the wall clock, from opening
            the requests to the last token.
        request_tps: Median over streams of a stream's tokens over the time
            from opening to its own last token.
        tokens: Tokens of all streams.
        seconds: The wall clock.
        acceptance: Accepted over drafted tokens, all streams; ``None`` where
            none were drafted.
        mean_k: Mean draft length of the drafting rounds.
        plain_tps: One request decoded plainly, timed alike.
        spec_tps: One request decoded speculatively at the same k, timed
            alike; ``None`` without a draft.
        speedup_plain: ``total_tps`` over ``plain_tps``.
        speedup_spec: ``total_tps`` over ``spec_tps``.
        request_share: ``request_tps`` over ``spec_tps`` (else ``plain_tps``):
            what a request gets of the rate it would get alone.
        exact: Whether every stream's reply is the target's greedy reply to
            its prompt alone, token for token; ``None`` when sampling.
        runs_tps: ``total_tps`` of each run, in the order they ran; the row's
            figures are the median run's.
    """

    streams: int
    k: str
    temp: float
    total_tps: float
    request_tps: float
    tokens: int
    seconds: float
    acceptance: float | None
    mean_k: float | None
    plain_tps: float
    spec_tps: float | None
    speedup_plain: float | None
    speedup_spec: float | None
    request_share: float | None
    exact: bool | None
    runs_tps: tuple[float, ...] = ()


def variants(prompt: Sequence[int], n: int) -> list[list[int]]:
    """``n`` prompts: ``prompt`` itself, then ``prompt`` with another last token each.

    The other last tokens are the prompt's own, taken from its end backwards,
    each value once, so every variant is as long as ``prompt`` and made of
    tokens the models see in it. Where the prompt has too few distinct
    tokens, the variants repeat.
    """
    lasts = list(dict.fromkeys(reversed(prompt)))
    return [[*prompt[:-1], lasts[i % len(lasts)]] for i in range(n)]


def _solo(decoder: Decoder, prompt: list[int], params: GenerationParams) -> Turns:
    """One request alone on ``decoder``, its caches dropped first (nothing to reuse).

    What the decoder has learned (acceptance, costs, Auto's state) carries
    over from its earlier runs, as the app keeps it per pair across replies.
    """
    decoder.forget()
    return take_turns([decoder.generate(prompt, params)], params.max_tokens)


def _batch(decoder: Decoder, params: GenerationParams, prompts: list[list[int]]) -> Turns:
    """``prompts`` opened at once on ``decoder``, its kept caches dropped first, and pulled
    to the end.

    Its costs and acceptance carry over from run to run, as the app keeps them per pair.
    """
    decoder.forget()
    return take_turns([decoder.generate(p, params) for p in prompts], params.max_tokens)


def _greedy(
    target: nn.Module, prompts: list[list[int]], params: GenerationParams, known: Replies
) -> None:
    """Fills ``known`` with the target's plain greedy reply to each prompt it lacks."""
    plain = replace(params, drafting=DraftSetting.fixed(0), temperature=0.0)
    for prompt in prompts:
        if tuple(prompt) not in known:
            known[tuple(prompt)] = _solo(Decoder(target), prompt, plain).replies[0]


def _warmed(
    run: Callable[[list[list[int]]], Turns], prompts: list[list[int]], warmup: bool, fresh: bool
) -> Turns:
    """``run`` of ``prompts`` after, where ``warmup``, an unmeasured one that built its kernels.

    Where ``fresh``, the warm-up's prompts are one token longer (each
    prompt's first token twice), so no measured forward meets a cache length
    the warm-up left behind, as requests of other lengths would not.
    """
    if warmup:
        run([[p[0], *p] for p in prompts] if fresh else prompts)
    return run(prompts)


def _tps(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def _ratio(a: float, b: float | None) -> float | None:
    return a / b if b else None


@dataclass(frozen=True, slots=True)
class StreamsConfig:
    """One configuration of the batch: its requests' sampling and draft setting, and how it runs.

    Attributes:
        params: The streams' sampling and draft setting.
        label: The rows' k (by default ``auto`` or the fixed k).
        options: How the batch runs (its draft cutoff, stretches, layout and
            prompt sharing); the single-request reference plans along
            stretches, as the app's decoder does.
    """

    params: GenerationParams
    label: str | None = None
    options: EngineOptions = DEFAULT_OPTIONS


@dataclass(slots=True)
class _Measured:
    """A configuration's decoder, its references alone, and its runs by stream count."""

    label: str
    params: GenerationParams
    batch: Decoder
    plain_reply: list[int]  # the first prompt's, decoded plainly: its greedy reply
    plain_tps: float
    spec_tps: float | None
    runs: dict[int, list[Turns]]


def measure_streams(
    target: nn.Module,
    draft: nn.Module | None,
    prompt_ids: Sequence[int],
    configs: GenerationParams | Sequence[StreamsConfig],
    streams: Sequence[int] = STREAMS,
    max_tokens: int = 128,
    warmup: bool = True,
    profile: CostProfile | None = None,
    replies: Replies | None = None,
    batch_costs: BatchCosts | None = None,
    fresh: bool = False,
    repeats: int = 1,
    log: Callable[[str], None] = lambda _s: None,
) -> list[StreamsRow]:
    """One row per configuration and stream count: its requests decoded together, against one alone.

    Every run, the references included, is timed from opening its requests
    to its last token, prefill in, after an unmeasured run of the same shape
    (``warmup``) so that no kernel build counts. No cache carries over from
    the warm-up (each decoder's kept caches are dropped); what the decoders
    learned does, their costs and acceptance, as the app keeps them for the
    pair from reply to reply. Each of ``repeats`` runs every stream count of
    every configuration once, starting one configuration later than the
    repeat before, so that none always runs first or last in the machine's
    slow and fast spells; a row gives the median run.

    Args:
        target: The model every stream gets its reply from.
        draft: The model that proposes tokens, if any.
        prompt_ids: The prompt; the streams get variants of it (:func:`variants`).
        configs: The configurations, or one's sampling and draft setting.
        streams: Stream counts, one row each.
        max_tokens: Tokens of every stream (end of sequence is not looked for).
        warmup: Run each shape once unmeasured first.
        profile: The pair's measured costs, which Auto starts from.
        replies: Greedy replies already known, by prompt; the missing ones
            are decoded plainly and added, so later calls on the same target
            can share them.
        batch_costs: The batch's costs, which its rounds measure and Auto
            plans with; they carry over from run to run (by default from this
            call's first run on).
        fresh: Warm up on prompts one token longer, so that the measured runs
            meet no cache length seen before (MLX's CUDA backend caches its
            graphs by shape, so replayed lengths run faster than new ones);
            each later repeat's prompts are longer again, so only the first
            repeat's streams are checked against the known replies. The
            streams' prompts differ in their last token only.
        repeats: Runs of each configuration and stream count.
        log: Where progress lines go.

    Raises:
        ValueError: A stream count or repeats below 1.
    """
    if any(n < 1 for n in streams) or repeats < 1:
        raise ValueError("stream counts and repeats start at 1")
    if isinstance(configs, GenerationParams):
        configs = [StreamsConfig(configs)]
    # The streams get the prompt with a different last token each, not one
    # prompt n times: each stream then has its own reply, so a round that gave
    # one request another's rows would fail `exact`; and at a miss rate above 0
    # the streams accept unevenly, as different users' requests do, where
    # identical ones would run in lockstep and flatter the batch.
    prompts = variants(prompt_ids, max(streams, default=1))
    known: Replies = replies if replies is not None else {}
    limit = max(c.params.drafting.limit for c in configs)
    # One batch cost model for every configuration, as the app keeps one per pair.
    shared = batch_costs if batch_costs is not None else BatchCosts(CostModel(limit + 1, profile))
    measured = []
    log("one request alone, plainly" + (" and speculatively" if draft is not None else ""))
    for config in configs:
        m = _references(target, draft, prompts, config, max_tokens, warmup, profile, shared, fresh)
        measured.append(m)
        if not m.params.sampled:
            known.setdefault(tuple(prompts[0]), m.plain_reply)
            _greedy(target, prompts, m.params, known)
    for r in range(repeats):
        turn = measured[r % len(measured) :] + measured[: r % len(measured)]
        # Where fresh, repeat r's prompts are 2r tokens longer (the warm-up's 1):
        # no repeat replays the lengths another met.
        longer = [[p[0]] * (2 * r * fresh) + p for p in prompts]
        for n in streams:
            for m in turn:
                log(f"{n} stream{'s' if n > 1 else ''} at k = {m.label}, run {r + 1}/{repeats}")
                batch = functools.partial(_batch, m.batch, m.params)
                first = warmup and r == 0
                m.runs.setdefault(n, []).append(_warmed(batch, longer[:n], first, fresh))
    return [_row(m, n, prompts, known, 1 if fresh else repeats) for m in measured for n in streams]


def _references(
    target: nn.Module,
    draft: nn.Module | None,
    prompts: list[list[int]],
    config: StreamsConfig,
    max_tokens: int,
    warmup: bool,
    profile: CostProfile | None,
    batch_costs: BatchCosts,
    fresh: bool,
) -> _Measured:
    """``config``'s batch decoder and its one request alone, plainly and speculatively."""
    params = replace(config.params, max_tokens=max_tokens)  # no round drafts past the budget
    k_max = params.drafting.limit

    def costs() -> CostModel:
        return CostModel(k_max + 1, profile)

    batch = trace.attach(Decoder(target, draft, costs(), batch_costs, config.options))
    plain_params = replace(params, drafting=DraftSetting.fixed(0))

    def solo(decoder: Decoder, p: GenerationParams) -> Turns:
        return _warmed(lambda ps: _solo(decoder, ps[0], p), prompts[:1], warmup, fresh)

    plain = solo(Decoder(target), plain_params)
    spec = None
    if draft is not None:
        # Warmed up and measured on one decoder, as the batch keeps its costs and acceptance.
        stretches = replace(config.options, stretch=True)
        decoder = trace.attach(Decoder(target, draft, costs(), options=stretches))
        spec = solo(decoder, params)
    return _Measured(
        label=config.label or str(params.drafting),
        params=params,
        batch=batch,
        plain_reply=plain.replies[0],
        plain_tps=_tps(max_tokens, plain.seconds),
        spec_tps=_tps(max_tokens, spec.seconds) if spec is not None else None,
        runs={},
    )


def _row(
    m: _Measured, n: int, prompts: list[list[int]], known: Replies, checked: int
) -> StreamsRow:
    """``n`` streams of ``m``'s configuration: its median run, all its rounds; the streams of
    its first ``checked`` runs against the known replies."""
    runs = m.runs[n]
    max_tokens = m.params.max_tokens
    seconds = statistics.median(run.seconds for run in runs)
    rounds = [r for run in runs for rs in run.rounds for r in rs]
    drafted = sum(r.k for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    ks = [r.k for r in rounds if r.k]
    total = _tps(n * max_tokens, seconds)
    request = statistics.median(_tps(max_tokens, s) for run in runs for s in run.finished)
    exact = None
    if not m.params.sampled:
        exact = all(
            got == known[tuple(p)]
            for run in runs[:checked]
            for got, p in zip(run.replies, prompts[:n], strict=True)
        )
    spec = m.spec_tps
    return StreamsRow(
        streams=n,
        k=m.label,
        temp=m.params.temperature,
        total_tps=total,
        request_tps=request,
        tokens=n * max_tokens,
        seconds=seconds,
        acceptance=accepted / drafted if drafted else None,
        mean_k=statistics.mean(ks) if ks else None,
        plain_tps=m.plain_tps,
        spec_tps=spec,
        speedup_plain=_ratio(total, m.plain_tps),
        speedup_spec=_ratio(total, spec),
        request_share=_ratio(request, spec or m.plain_tps),
        exact=exact,
        runs_tps=tuple(_tps(n * max_tokens, run.seconds) for run in runs),
    )


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def streams_table(rows: Sequence[StreamsRow]) -> str:
    """One line per stream count under a line with the single-request references."""
    lines: list[str] = []
    for k, temp in dict.fromkeys((r.k, r.temp) for r in rows):
        group = [r for r in rows if (r.k, r.temp) == (k, temp)]
        spec = _cell(group[0].spec_tps, ".2f")
        runs = len(group[0].runs_tps)
        lines.append(
            f"k {k}, temp {temp:.2f}; one request alone: plain {group[0].plain_tps:.2f} tok/s, "
            f"speculative {spec} tok/s" + (f"; median of {runs} runs" if runs > 1 else "")
        )
        lines.append(
            f"{'streams':>7} {'tok/s':>8} {'req tok/s':>9} {'tokens':>6} {'s':>7} {'accept':>7} "
            f"{'mean k':>6} {'x plain':>7} {'x spec':>7} {'per req':>7} {'exact':>5}"
        )
        for r in group:
            exact = "-" if r.exact is None else "yes" if r.exact else "no"
            acc = "-" if r.acceptance is None else f"{r.acceptance:.0%}"
            lines.append(
                f"{r.streams:>7} {r.total_tps:>8.2f} {r.request_tps:>9.2f} {r.tokens:>6} "
                f"{r.seconds:>7.2f} {acc:>7} {_cell(r.mean_k, '.1f'):>6} "
                f"{_times(r.speedup_plain):>7} {_times(r.speedup_spec):>7} "
                f"{_cell(r.request_share, '.2f'):>7} {exact:>5}"
            )
    return "\n".join(lines)


__all__ = ["STREAMS", "StreamsConfig", "StreamsRow", "measure_streams", "streams_table", "variants"]
