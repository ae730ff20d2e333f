"""``tandem bench``: plain decoding, mlx-lm's speculative loop and Tandem's, side by side.

All implementations run in one process, interleaved, after a warm-up, on the
same prompts, for exactly ``max_tokens`` tokens each (end of sequence is
ignored so every run does the same work). Speed is decoding speed: tokens
after the first over the time after the first, so prompt processing is left out
for every implementation alike. ``--batch-profile`` and ``--concurrent`` run
instead (:mod:`app.bench.batch`, :mod:`app.bench.concurrent`) on the same models.
Imports no Qt, so it runs on any MLX machine.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn

from app import backend_env
from app.bench import trace
from app.engine.calibrate import default_prompts
from app.engine.costs import (
    K_MAX,
    CostModel,
    CostProfile,
    ProfileProgress,
    ProfileStore,
)
from app.engine.decoder import Decoder
from app.engine.options import DEFAULT_OPTIONS, EngineOptions
from app.engine.rounds import Prefill, Round
from app.engine.types import DraftSetting, GenerationParams
from app.errors import first_line
from app.files import not_regular, write_atomic, write_problem

IMPLS = ("plain", "mlx-lm", "tandem")


@dataclass(frozen=True, slots=True)
class Run:
    """One generation: tokens produced and how."""

    tokens: list[int]
    seconds: float  # after the first token
    first_tokens: int  # tokens of the round that delivered the first token
    drafted: int
    accepted: int
    target_calls: int
    ks: tuple[int, ...] = ()
    # (k, width, ms, timed, ms from the first token to its arrival) of each round;
    # plain rounds (k = 0) come too, so the gaps between rounds can be read.
    rounds: tuple[tuple[int, int, float, int, float], ...] = ()

    @property
    def tps(self) -> float:
        n = len(self.tokens) - self.first_tokens
        return n / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Row:
    """Aggregated runs of one (impl, k, temperature)."""

    impl: str
    k: str
    temp: float
    tps: list[float] = field(default_factory=list)
    # Tokens and seconds counted by the runs' rates, summed: over prompts unlike in
    # speed, the rate of the whole set, where a median of runs may fall between them.
    decoded: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    target_calls: int = 0
    ks: list[int] = field(default_factory=list)
    speedup: float | None = None
    # Greedy runs whose reply was plain decoding's of the same prompt (None: not greedy,
    # or no plain run of that prompt to compare with).
    same_as_plain: int | None = None
    rounds: list[tuple[int, int, float, int, float]] = field(default_factory=list)
    learned: dict[str, Any] | None = None  # the decoder's costs after the runs

    @property
    def median_tps(self) -> float:
        return statistics.median(self.tps) if self.tps else 0.0

    @property
    def overall_tps(self) -> float:
        return self.decoded / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_call(self) -> float | None:
        return self.tokens / self.target_calls if self.target_calls else None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            median_tps=self.median_tps,
            overall_tps=self.overall_tps,
            acceptance=self.acceptance,
            tokens_per_call=self.tokens_per_call,
            mean_k=statistics.mean(self.ks) if self.ks else None,
        )
        return d


def _sampler(temp: float) -> Callable[[mx.array], mx.array] | None:
    from mlx_lm.sample_utils import make_sampler

    return make_sampler(temp) if temp > 0 else None


def _timed(
    items: Iterator[Any], max_tokens: int, count: Callable[[Any], int]
) -> tuple[list[Any], float, int]:
    """Pulls items until ``max_tokens`` tokens; times everything after the first."""
    out: list[Any] = []
    n = first = 0
    t0 = 0.0
    for item in items:
        out.append(item)
        n += count(item)
        if len(out) == 1:
            first, t0 = n, time.perf_counter()
        if n >= max_tokens:
            break
    return out, time.perf_counter() - t0, first


def run_plain(target: nn.Module, prompt: list[int], max_tokens: int, temp: float) -> Run:
    from mlx_lm.generate import generate_step

    gen = generate_step(mx.array(prompt), target, max_tokens=max_tokens, sampler=_sampler(temp))
    out, secs, first = _timed(gen, max_tokens, lambda _x: 1)
    tokens = [int(t) for t, _ in out]
    return Run(tokens, secs, first, 0, 0, len(tokens))


def run_mlx_lm(
    target: nn.Module, draft: nn.Module, prompt: list[int], max_tokens: int, temp: float, k: int
) -> Run:
    from mlx_lm.generate import speculative_generate_step

    gen = speculative_generate_step(
        mx.array(prompt),
        target,
        draft,
        num_draft_tokens=k,
        max_tokens=max_tokens,
        sampler=_sampler(temp),
    )
    out, secs, _ = _timed(gen, max_tokens, lambda _x: 1)
    tokens = [int(t) for t, _, _ in out]
    accepted = sum(1 for _, _, from_draft in out if from_draft)
    rounds = sum(1 for _, _, from_draft in out if not from_draft)
    # The loop yields a round's tokens one by one, all computed: the first round's
    # accepted drafts come with its first token and are not decoding time's.
    first = next((i + 1 for i, (_, _, drafted) in enumerate(out) if not drafted), len(out))
    # Each round drafts k tokens (fewer only at the very end) and ends on a target token.
    return Run(tokens, secs, first, rounds * k, accepted, rounds)


def run_tandem(
    decoder: Decoder,
    prompt: list[int],
    max_tokens: int,
    temp: float,
    k: int | None,
    lookup: bool = False,
    k_max: int = K_MAX,
) -> Run:
    params = GenerationParams(
        max_tokens=max_tokens,
        temperature=temp,
        drafting=DraftSetting.of(k, k_max),
        prompt_lookup=lookup,
    )
    rounds = (r for r in decoder.generate(prompt, params) if not isinstance(r, Prefill))
    arrived: list[float] = []

    def count(r: Round) -> int:
        arrived.append(time.perf_counter())
        return len(r.tokens)

    out, secs, first = _timed(rounds, max_tokens, count)
    tokens = [t for r in out for t in r.tokens][:max_tokens]
    t0 = arrived[0] if arrived else 0.0
    return Run(
        tokens,
        secs,
        first,
        sum(r.k for r in out),
        sum(r.accepted for r in out),
        len(out),
        tuple(r.k for r in out if r.k),
        tuple(
            (r.k, r.width, round(r.seconds * 1e3, 2), int(r.timed), round((at - t0) * 1e3, 2))
            for r, at in zip(out, arrived, strict=True)
        ),
    )


def ttft_cold_and_warm(
    pair: Any, first: str, follow_up: str, max_tokens: int = 32, store: ProfileStore | None = None
) -> dict[str, float | int]:
    """Time to first token of a follow-up turn, with the caches of turn one and without.

    The pair's cost profile is read from and stored in ``store`` (the default one when omitted).
    """
    from app.engine.generate import new_decoder, stream_reply
    from app.engine.types import Chunk, Finished, Message

    params = GenerationParams(
        max_tokens=max_tokens, drafting=DraftSetting.of(None if pair.draft else 0)
    )
    turn = [Message("user", first)]
    decoder = trace.attach(
        new_decoder(pair, store)
    )  # one conversation: its caches carry over between turns
    events = list(stream_reply(pair, turn, params, decoder=decoder))
    reply = "".join(e.text for e in events if isinstance(e, Chunk))
    turn2 = [*turn, Message("assistant", reply), Message("user", follow_up)]
    out: dict[str, float | int] = {}
    for label in ("warm", "cold"):
        if label == "cold":
            decoder.forget()
        done = list(stream_reply(pair, turn2, params, decoder=decoder))[-1]
        assert isinstance(done, Finished)
        out[f"{label}_ttft_seconds"] = done.stats.ttft_seconds
        out[f"{label}_reused_tokens"] = done.stats.reused_tokens
        out["prompt_tokens"] = done.stats.prompt_tokens
        # Leave the caches as turn one left them for the cold run's baseline.
        if label == "warm":
            list(stream_reply(pair, turn, params, decoder=decoder))
    return out


def first_token_seconds(decoder: Decoder, prompt: list[int], params: GenerationParams) -> float:
    """Time to first token of ``prompt`` from empty caches: prefill plus the first round."""
    decoder.forget()
    start = time.perf_counter()
    gen = decoder.generate(prompt, params)
    try:
        for event in gen:
            if isinstance(event, Round):
                return time.perf_counter() - start
    finally:
        gen.close()
    return time.perf_counter() - start


def ttft_by_drafter(
    target: nn.Module, draft: nn.Module | None, prompt: list[int], repeats: int = 2
) -> dict[str, float]:
    """Median time to first token, cold, plain and with each drafter."""
    settings = {"plain": (False, 0), "lookup": (True, None)}
    if draft is not None:
        settings.update({"draft": (False, None), "lookup+draft": (True, None)})
    out: dict[str, float] = {}
    for label, (lookup, k) in settings.items():
        decoder = trace.attach(Decoder(target, draft if label.endswith("draft") else None))
        params = GenerationParams(max_tokens=4, drafting=DraftSetting.of(k), prompt_lookup=lookup)
        first_token_seconds(decoder, prompt, params)  # builds kernels for this prompt length
        runs = [first_token_seconds(decoder, prompt, params) for _ in range(repeats)]
        out[label] = statistics.median(runs)
    return out


def profile_table(profile: CostProfile) -> str:
    """The verification cost per width, in ms and in plain steps, and the draft step."""
    lines = [f"{'m':>3} {'ms':>9} {'steps':>6}"]
    for m in range(1, profile.widths + 1):
        v, steps = profile.v(m), profile.steps(m)
        ms = f"{v * 1e3:.2f}" if v is not None else "-"
        lines.append(f"{m:>3} {ms:>9} {steps:>6.2f}" if steps else f"{m:>3} {ms:>9} {'-':>6}")
    c, step = profile.draft_step, profile.step
    if c is not None:
        ratio = f" (c = {c / step:.3f} of a step)" if step else ""
        lines.append(f"draft step {c * 1e3:.2f} ms{ratio}")
    if profile.build:
        lines.append(f"a width's first forward builds kernels: {profile.build * 1e3:.1f} ms more")
    lines.append(f"context {profile.context} tokens, {profile.device}, mlx {profile.mlx}")
    return "\n".join(lines)


def rewind_costs(target: nn.Module, widths: int, context: int) -> list[dict[str, float]]:
    """What giving back rejected rows costs a hybrid target, against verifying them.

    For a few widths m: the verification of m rows (the best of 3) and the
    rewind to m // 2 of them (their states kept or recomputed, evaluated).
    Empty for a target with no recurrent layers, whose rewind is a trim.
    """
    from app.engine.caches import new_cache, prefill, rewind
    from app.engine.costs import probe_tokens, vocab_size
    from app.engine.recurrent import RecurrentCache, install, leaves

    cache = new_cache(target)
    if not any(isinstance(c, RecurrentCache) for c in leaves(cache)):
        return []
    install(target)
    tokens = probe_tokens(vocab_size(target), context + widths)
    prefill(target, cache, tokens[:context])
    out = []
    for m in sorted({w for w in (2, 5, 9, widths) if 1 < w <= widths}):
        x = mx.array(tokens[context : context + m])[None]
        verify, back = [], []
        for _ in range(4):  # the first builds kernels
            t0 = time.perf_counter()
            mx.eval(target(x, cache=cache), [c.state for c in cache])
            t1 = time.perf_counter()
            rewind(cache, m - m // 2)
            mx.eval([c.state for c in cache])
            verify.append(t1 - t0)
            back.append(time.perf_counter() - t1)
            rewind(cache, m // 2)
        out.append({"m": m, "verify_ms": min(verify[1:]) * 1e3, "rewind_ms": min(back[1:]) * 1e3})
    return out


def rewind_table(rows: list[dict[str, float]], state_bytes: int) -> str:
    lines = [f"{'m':>3} {'verify ms':>10} {'rewind ms':>10} {'share':>6}  (rewind to m // 2 rows)"]
    for r in rows:
        share = r["rewind_ms"] / r["verify_ms"]
        lines.append(
            f"{r['m']:>3.0f} {r['verify_ms']:>10.2f} {r['rewind_ms']:>10.2f} {share:>6.1%}"
        )
    lines.append(f"recurrent state {state_bytes / 2**20:.1f} MiB a request")
    return "\n".join(lines)


def read_prompts(path: Path) -> list[str]:
    """Prompts from a JSON list (of strings or of {"prompt": ...}) or one per line.

    Raises:
        ValueError: The file is missing, unreadable, no regular file, or holds
            no prompts, with a one-line reason.
    """
    if (problem := not_regular(path)) is not None:
        raise ValueError(f"{path} {problem}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else first_line(exc)
        raise ValueError(f"cannot read {path} ({reason})") from exc
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        prompts = [line for line in text.splitlines() if line.strip()]
    else:
        if not isinstance(data, list):
            raise ValueError(f"{path} holds JSON that is not a list of prompts")
        prompts = [_prompt_text(p) for p in data]
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


def _prompt_text(item: Any) -> str:
    if isinstance(item, dict):
        if not isinstance(item.get("prompt"), str):
            raise ValueError('an object in the list has no "prompt" text')
        return str(item["prompt"])
    return str(item)


def benchmark(
    target: nn.Module,
    draft: nn.Module | None,
    prompts: Sequence[list[int]],
    *,
    ks: Sequence[int | None] = (0, 2, 4, 6, None),
    temps: Sequence[float] = (0.0,),
    max_tokens: int = 128,
    repeats: int = 1,
    impls: Sequence[str] = IMPLS,
    lookup: bool = False,
    warmup: int = 16,
    seed: int = 0,
    log: Callable[[str], None] = lambda _s: None,
    profile: CostProfile | None = None,
    k_max: int = K_MAX,
    draft_cutoff: bool = False,
    options: EngineOptions = DEFAULT_OPTIONS,
    mlx_ks: Sequence[int] | None = None,
    on_repeat: Callable[[list[Row], int], None] | None = None,
    fresh_shapes: bool = False,
) -> list[Row]:
    """Runs every configuration ``repeats`` times over ``prompts``, interleaved.

    Each repeat starts one configuration later than the one before. Where
    ``fresh_shapes``, every measured run's prompt is longer than any run's
    before (its first token repeated), so no measured forward meets a cache
    length an earlier run left behind: MLX's CUDA backend caches its graphs
    by shape, so a replayed run is faster than a request of another length.

    Tandem's decoders start from ``profile`` (measured once per pair, as the
    app stores it); without one they measure costs as they run.
    ``on_repeat`` gets the rows so far and the repeats done after each repeat,
    so that a run cut short still leaves its numbers.
    """
    configs: list[tuple[str, int | None, float]] = []
    for temp in temps:
        if "plain" in impls:
            configs.append(("plain", 0, temp))
        for k in ks:
            if k == 0:
                if "tandem" in impls and "plain" not in impls:
                    configs.append(("tandem", 0, temp))
                continue
            if k in VARIANTS:  # Auto as the batch runs it, or with the draft cutoff or without
                if "tandem" in impls and (draft is not None or lookup):
                    configs.append(("tandem", k, temp))
                continue
            if "mlx-lm" in impls and draft is not None and k is not None and mlx_ks is None:
                configs.append(("mlx-lm", k, temp))
            if "tandem" in impls and (draft is not None or lookup):
                configs.append(("tandem", k, temp))

    if "mlx-lm" in impls and draft is not None and mlx_ks is not None:
        configs += [("mlx-lm", k, temp) for temp in temps for k in mlx_ks if k]
    # One decoder per configuration, kept across prompts as the app keeps it
    # across turns (its draft-length controller and baseline carry over).
    tandem = [c for c in configs if c[0] == "tandem"]
    decoders = {
        c: trace.attach(
            Decoder(
                target,
                draft,
                CostModel(k_max + 1, profile),
                options=replace(
                    options, draft_cutoff=_cutoff(c[1], draft_cutoff), stretch=c[1] != POOLED
                ),
            )
        )
        for c in tandem
    }

    def once(impl: str, k: int | None, temp: float, prompt: list[int], n: int) -> Run:
        if impl == "plain":
            return run_plain(target, prompt, n, temp)
        if impl == "mlx-lm":
            assert draft is not None and k is not None
            return run_mlx_lm(target, draft, prompt, n, temp, k)
        auto = None if k in VARIANTS else k
        return run_tandem(decoders[(impl, k, temp)], prompt, n, temp, auto, lookup, k_max)

    log(f"warm-up: {len(configs)} configurations, {warmup} tokens")
    for impl, k, temp in configs:
        once(impl, k, temp, prompts[0], min(warmup, max_tokens))
    rows = {c: Row(c[0], _label(c[1]), c[2]) for c in configs}
    replies: dict[tuple[str, int | None, float], list[tuple[int, list[int]]]] = {}
    mx.random.seed(seed)
    runs = 0
    for r in range(repeats):
        # The order rotates each repeat: no configuration always runs first or last.
        turn = configs[r % len(configs) :] + configs[: r % len(configs)]
        for i, prompt in enumerate(prompts):
            for config in turn:
                runs += 1
                longer = [prompt[0]] * runs + prompt if fresh_shapes else prompt
                run = once(*config, longer, max_tokens)
                row = rows[config]
                row.tps.append(run.tps)
                row.decoded += len(run.tokens) - run.first_tokens
                row.seconds += run.seconds
                row.drafted += run.drafted
                row.accepted += run.accepted
                row.tokens += len(run.tokens)
                row.target_calls += run.target_calls
                row.ks += run.ks
                row.rounds += run.rounds
                if not fresh_shapes:  # each run's prompt its own: nothing to compare
                    replies.setdefault(config, []).append((i, run.tokens))
            log(f"repeat {r + 1}/{repeats}, prompt {i + 1}/{len(prompts)} done")
        _compare_with_plain(rows, replies)
        if on_repeat is not None:
            on_repeat(_summarise(rows, decoders), r + 1)
    return _summarise(rows, decoders)


def _compare_with_plain(
    rows: dict[tuple[str, int | None, float], Row],
    replies: dict[tuple[str, int | None, float], list[tuple[int, list[int]]]],
) -> None:
    """Counts each greedy row's replies that are plain decoding's of the same prompt."""
    plain = {i: tokens for i, tokens in replies.get(("plain", 0, 0.0), [])}
    for config, row in rows.items():
        if config[2] == 0 and config[0] != "plain" and plain:
            done = [(i, t) for i, t in replies.get(config, []) if i in plain]
            row.same_as_plain = sum(t == plain[i] for i, t in done)


def _summarise(
    rows: dict[tuple[str, int | None, float], Row],
    decoders: dict[tuple[str, int | None, float], Decoder],
) -> list[Row]:
    """The rows with what each decoder learned and the speedup over plain decoding."""
    for config, decoder in decoders.items():
        rows[config].learned = decoder.costs.profile().as_dict()
    out = list(rows.values())
    for row in out:
        plain = next((p for p in out if p.impl == "plain" and p.temp == row.temp), None)
        if plain is not None and plain.median_tps:
            row.speedup = row.median_tps / plain.median_tps
    return out


def table(rows: Sequence[Row]) -> str:
    """A plain-text table of the results."""
    w = max([4, *(len(r.k) for r in rows)])
    lines = [
        f"{'impl':<8} {'k':>{w}} {'temp':>5} {'tok/s':>8} {'overall':>8} {'speedup':>8} "
        f"{'accept':>7} {'tok/call':>8} {'mean k':>6} {'=plain':>6}"
    ]
    for r in rows:
        acc = f"{r.acceptance:.0%}" if r.acceptance is not None else "-"
        sp = f"{r.speedup:.2f}x" if r.speedup is not None else "-"
        tpc = f"{r.tokens_per_call:.2f}" if r.tokens_per_call is not None else "-"
        mk = f"{statistics.mean(r.ks):.1f}" if r.ks else "-"
        same = f"{r.same_as_plain}/{len(r.tps)}" if r.same_as_plain is not None else "-"
        lines.append(
            f"{r.impl:<8} {r.k:>{w}} {r.temp:>5.2f} {r.median_tps:>8.2f} {r.overall_tps:>8.2f} "
            f"{sp:>8} {acc:>7} {tpc:>8} {mk:>6} {same:>6}"
        )
    return "\n".join(lines)


def _ks(text: str) -> list[int | None]:
    """``"0,2,auto,auto-pooled"`` -> ``[0, 2, None, POOLED]``; k from 0 to 16.

    Raises:
        ValueError: A value that is neither one of Auto's names nor a k in range.
    """
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip()
        if part in _AUTO:
            out.append(_AUTO[part])
            continue
        if not part.isdigit() or int(part) > K_MAX:
            raise ValueError(
                f"--ks takes {', '.join(repr(a) for a in _AUTO)} or whole numbers "
                f"from 0 to {K_MAX}, not '{part}'"
            )
        out.append(int(part))
    return out


POOLED = -1  # --ks auto-pooled: Auto without the stretch belief
CUTOFF = -2  # --ks auto-cutoff: Auto that ends every draft where the draft is unsure
UNCUT = -3  # --ks auto-uncut: Auto that never ends a draft early
VARIANTS = (POOLED, CUTOFF, UNCUT)  # Auto run another way, beside plain Auto in one process
_AUTO: dict[str, int | None] = {
    "auto": None,
    "auto-pooled": POOLED,
    "auto-cutoff": CUTOFF,
    "auto-uncut": UNCUT,
}


def _cutoff(k: int | None, asked: bool) -> bool | None:
    """A configuration's draft cutoff: the app's own rule (None) unless asked for, or off."""
    if k == UNCUT:
        return False
    return True if asked or k == CUTOFF else None


def _label(k: int | None) -> str:
    """A configuration's k as the table shows it."""
    return next((name for name, v in _AUTO.items() if v == k), str(k))


def _stream_counts(text: str) -> list[int]:
    """``"1,2,4,8"`` -> ``[1, 2, 4, 8]``: how many requests ``--concurrent`` opens at once.

    Raises:
        ValueError: A value that is not a whole number from 1 up.
    """
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"--concurrent takes whole numbers from 1, not '{part}'")
        out.append(int(part))
    return out


def _misses(text: str | float) -> list[float]:
    """``"0,0.1"`` -> ``[0.0, 0.1]``: the synthetic draft's miss rates, each from 0 to 1.

    Raises:
        ValueError: A value that is not a rate.
    """
    out = []
    for part in str(text).split(","):
        try:
            miss = float(part)
        except ValueError:
            miss = -1.0
        if not 0.0 <= miss <= 1.0:
            raise ValueError(f"--miss takes rates from 0 to 1, comma-separated, not '{part}'")
        out.append(miss)
    return out


def _json_path(path: str | None, miss: float | None) -> Path | None:
    """Where a run's JSON goes; with several miss rates, one file each (``x-miss0.1.json``)."""
    if not path:
        return None
    p = Path(path)
    return p if miss is None else p.with_name(f"{p.stem}-miss{miss:g}{p.suffix}")


class _RefusedFileError(Exception):
    """A file the bench will not write; :func:`main` says so in one line."""


def _write_json(
    path: Path, meta: dict[str, Any], rows: Sequence[dict[str, Any]] | None = None
) -> None:
    """Writes a run's JSON whole: a run killed meanwhile leaves the file it had before.

    Raises:
        _RefusedFileError: ``path`` is a link, a folder or no regular file (checked again
            now: it may have changed since the run began), or cannot be written.
    """
    if (problem := write_problem(path)) is not None:
        raise _RefusedFileError(problem)
    out: dict[str, Any] = {"meta": meta}
    if rows is not None:
        out["rows"] = list(rows)
    try:
        write_atomic(path, json.dumps(out, indent=2).encode())
    except OSError as exc:
        raise _RefusedFileError(f"cannot write {path} ({exc.strerror or first_line(exc)})") from exc


def _next_draft(
    miss: float | None, make: Callable[[], nn.Module | None], count: int, meta: dict[str, Any]
) -> nn.Module | Literal[False] | None:
    """The next miss rate's draft, its rate noted in ``meta``; ``False``: it cannot be built."""
    try:
        draft = make()
    except ValueError as exc:  # a draft shape that cannot be quantized
        print(f"tandem: {exc}", file=sys.stderr, flush=True)
        return False
    if miss is not None:
        meta["miss"] = miss
        if count > 1:
            print(f"== miss {miss:g}")
    if draft is not None:
        meta["wide_rows_draft"] = _wide(draft, "draft")
    return draft


def _wide(model: nn.Module, role: str) -> int | None:
    """Sets (measuring, by ``--wide``) the rows from which ``model`` dequantizes; says which."""
    from app.engine import wide

    rows = wide.install(model)
    said = f"dequantize from {rows} rows" if rows else "never dequantize"
    print(f"{role}: wide forwards {said}", file=sys.stderr, flush=True)
    return rows


def _mlx_lm_speculates(target: nn.Module) -> bool:
    """Whether mlx-lm's speculative loop takes ``target``: it needs caches it can trim."""
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

    return bool(can_trim_prompt_cache(make_prompt_cache(target)))


def _batch_profile(
    target: nn.Module, draft: nn.Module | None, args: Any, meta: dict[str, Any]
) -> int:
    """``--batch-profile``: the (sequences, rows) cost table, printed and written.

    With a draft, its step too (one row per sequence): whether packing the
    draft's steps across requests pays.
    """
    from app.bench.batch import batch_table, measure_batch_costs

    print("measuring one forward of several sequences, three ways", file=sys.stderr)
    costs = measure_batch_costs(target, context=args.context)
    print(batch_table(costs))
    steps = measure_batch_costs(draft, rows=(1,), context=args.context) if draft else []
    if steps:
        print("the draft's step:")
        print(batch_table(steps))
    if args.json:
        meta["batch_profile"] = [asdict(c) for c in costs]
        meta["draft_batch_profile"] = [asdict(c) for c in steps]
        _write_json(Path(args.json), meta)
    return 0


def _concurrent(
    target: nn.Module,
    drafts: Sequence[tuple[float | None, Callable[[], nn.Module | None]]],
    prompt: list[int],
    counts: Sequence[int],
    ks: Sequence[int | None],
    temps: Sequence[float],
    k_max: int,
    args: Any,
    meta: dict[str, Any],
) -> int:
    """``--concurrent``: n requests on one batch for each n, per miss rate, k and temperature."""
    from app.bench.concurrent import Replies, StreamsConfig, measure_streams, streams_table
    from app.engine.batch_costs import BatchCosts

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    replies: Replies = {}  # the target's greedy replies, the same whatever drafts
    options: EngineOptions = args.engine_options
    for miss, make_draft in drafts:
        draft_model = _next_draft(miss, make_draft, len(drafts), meta)
        if draft_model is False:
            return 2
        profile = None
        # Only Auto plans with the costs: a fixed k runs without the profile's minutes.
        auto = any(k is None or k in VARIANTS for k in ks)
        if auto and draft_model is not None and not args.cold:
            log(f"measuring verification costs for widths 1-{k_max + 1}")
            profile = _measure(target, draft_model, k_max + 1, args.context, options)
            meta["profile"] = profile.as_dict()
        # One batch cost model for the pair, as the app keeps: each run measures its shapes.
        batch_costs = BatchCosts(CostModel(k_max + 1, profile))
        configs = [
            StreamsConfig(
                GenerationParams(
                    drafting=DraftSetting.of(None if k in VARIANTS else k, k_max), temperature=temp
                ),
                _label(k),
                replace(options, draft_cutoff=_cutoff(k, args.draft_cutoff), stretch=k != POOLED),
            )
            for k in ks
            for temp in temps
        ]
        rows = measure_streams(
            target,
            draft_model,
            prompt,
            configs,
            streams=counts,
            max_tokens=args.max_tokens,
            profile=profile,
            replies=replies,
            batch_costs=batch_costs,
            fresh=args.fresh_shapes,
            repeats=args.repeats,
            log=log,
        )
        print(streams_table(rows), flush=True)
        learned = batch_costs.profile()
        print(learned.table(), flush=True)
        meta["batch_costs"] = learned.as_dict()
        json_path = _json_path(args.json, miss if len(drafts) > 1 else None)
        if json_path:
            meta.update(
                max_tokens=args.max_tokens,
                concurrent=list(counts),
                repeats=args.repeats,
                prompt_tokens=len(prompt),
                fresh_shapes=args.fresh_shapes,
                side_by_side=options.side_by_side,
                share_prompts=options.share_prompts,
            )
            _write_json(json_path, meta, [asdict(r) for r in rows])
        del draft_model
        mx.clear_cache()
    return 0


def _measure(
    target: nn.Module, draft: nn.Module | None, widths: int, context: int, options: EngineOptions
) -> CostProfile:
    profile = None
    measuring = Decoder(target, draft, options=options)  # on the paths its runs take
    for event in measuring.measure_costs(widths, context=context):
        if not isinstance(event, ProfileProgress):
            profile = event
    assert profile is not None
    return profile


def _bad_argument(args: Any) -> str | None:
    """What is wrong with ``tandem bench``'s numbers, in one line; ``None`` when nothing is."""
    for option, value, least in (
        ("--context", args.context, 1),
        ("--max-tokens", args.max_tokens, 1),
        ("--repeats", args.repeats, 1),
        ("--warmup", args.warmup, 0),
    ):
        if value < least:
            return f"{option} must be {least} or more, not {value}"
    return None


def main(args: Any) -> int:
    """Runs ``tandem bench`` from parsed arguments.

    Bad arguments exit 2 in one line before anything runs; a ``--json`` file it
    will not write (a link, a folder, no regular file) exits 1 in one line.
    """
    if (problem := _bad_argument(args)) is not None:
        print(f"tandem: {problem}", file=sys.stderr)
        return 2
    if args.prompts:
        try:
            args.prompt_texts = read_prompts(Path(args.prompts))
        except ValueError as exc:
            print(f"tandem: --prompts: {exc}", file=sys.stderr)
            return 2
    for option, path in (("--json", args.json), ("--trace", getattr(args, "trace", None))):
        if path and (problem := write_problem(Path(path))) is not None:
            print(f"tandem: {option}: {problem}", file=sys.stderr)
            return 1
    if getattr(args, "trace", None):
        trace.start(Path(args.trace))
    try:
        return _main(args)
    except _RefusedFileError as exc:
        print(f"tandem: --json: {exc}", file=sys.stderr)
        return 1
    finally:
        trace.stop()


def _main(args: Any) -> int:
    from app.engine.generate import encode_chat
    from app.engine.loader import load_pair
    from app.engine.types import Message
    from app.errors import IncompatiblePairError, ModelError
    from app.testing import synthetic as syn

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        ks = _ks(args.ks)
        counts = _stream_counts(args.concurrent) if args.concurrent else None
    except ValueError as exc:
        log(f"tandem: {exc}")
        return 2
    temps = [float(t) for t in args.temps.split(",")]
    impls = [i for i in args.impls.split(",") if i]
    for impl in impls:
        if impl not in IMPLS:
            log(f"tandem: unknown implementation '{impl}' (one of {', '.join(IMPLS)})")
            return 2
    from app.engine import attention, wide

    try:
        args.engine_options = EngineOptions(
            attention=args.attention,
            wide=wide.parse_mode(args.wide),
            side_by_side=args.side_by_side is not False,
            share_prompts=args.share_prompts is not False,
        )
    except ValueError as exc:
        log(f"tandem: {exc}")
        return 2
    args.engine_options.apply()  # mlx-lm's loop, compared, runs the same paths
    k_max = min(args.k_max or max([k for k in ks if k and k > 0] or [K_MAX]), K_MAX)
    meta: dict[str, Any] = {
        "device": str(mx.default_device()),
        "mlx": getattr(mx, "__version__", "?"),
        "mlx_env": backend_env.settings(),
        "attention": args.attention,
        "verify_attention": attention.resolve(args.attention),
        "wide": args.wide,
        "fused": args.fuse,
        "k_max": k_max,
        "draft_cutoff": args.draft_cutoff,
    }
    pair: Any = None
    drafts: list[tuple[float | None, Callable[[], nn.Module | None]]]
    if args.synthetic:
        from app.engine.fuse import fuse

        try:
            misses = _misses(args.miss)
            t_shape, d_shape = syn.parse_pair(args.synthetic)
            dtype = getattr(mx, args.dtype)
            log(f"building {t_shape} ({syn.describe(t_shape)}) and {d_shape}")
            target = syn.build(t_shape, dtype=dtype, bits=args.bits)
            vocab = syn.config(t_shape)["vocab_size"]
        except ValueError as exc:
            log(f"tandem: {exc}")
            return 2
        if args.fuse:
            fuse(target)

        def synthetic_draft(miss: float) -> nn.Module:
            if d_shape == syn.HEAD:
                return syn.build_head(target, t_shape, miss=miss, dtype=dtype, bits=args.bits)
            model = syn.build(
                d_shape, miss=miss, vocab_size=vocab, dtype=dtype, seed=1, bits=args.bits
            )
            if args.fuse:
                fuse(model)
            return model

        # The target is built once; each miss rate gets a draft of its own.
        drafts = [(m, functools.partial(synthetic_draft, m)) for m in misses]
        prompts = [syn.prompt(t_shape)]
        ttft_prompt = syn.prompt(t_shape, repeats=6)
        meta.update(synthetic=args.synthetic, dtype=args.dtype, bits=args.bits)
    else:
        if not args.model:
            log("tandem: bench needs --model DIR (and usually --draft DIR) or --synthetic T:D")
            return 2
        try:
            pair = load_pair(args.model, args.draft, fuse=args.fuse)
        except IncompatiblePairError as exc:
            log(f"tandem: {exc}")
            return 2
        except ModelError as exc:
            log(f"tandem: {exc}")
            return 1
        target = pair.target.model
        loaded = pair.draft.model if pair.draft else None

        def loaded_draft() -> nn.Module | None:
            return loaded

        drafts = [(None, loaded_draft)]
        texts = getattr(args, "prompt_texts", None) or default_prompts()
        prompts = [encode_chat(pair.target.tokenizer, [Message("user", t)]) for t in texts]
        ttft_prompt = max(prompts, key=len)
        meta.update(model=args.model, draft=args.draft, prompts=len(prompts))

    speculates = args.synthetic or args.draft
    if "mlx-lm" in impls and speculates and not _mlx_lm_speculates(target):
        why = "mlx-lm's loop cannot speculate on this target (hybrid layers: no trimmable cache)"
        if args.impls != ",".join(IMPLS):  # asked for by name
            log(f"tandem: {why}; leave mlx-lm out of --impls")
            return 2
        log(f"{why}: left out")
        impls.remove("mlx-lm")
    meta["wide_rows_target"] = _wide(target, "target")
    if args.batch_profile:
        first = drafts[0][1]() if drafts else None
        return _batch_profile(target, first, args, meta)
    if counts:
        return _concurrent(target, drafts, prompts[0], counts, ks, temps, k_max, args, meta)
    built = 0.0  # a later measurement finds the kernels built: the first one's build holds
    for miss, make_draft in drafts:
        draft_model = _next_draft(miss, make_draft, len(drafts), meta)
        if draft_model is False:
            return 2
        profile: CostProfile | None = None
        if args.profile or not args.cold:
            log(f"measuring verification costs for widths 1-{k_max + 1}")
            profile = _measure(target, draft_model, k_max + 1, args.context, args.engine_options)
            built = max(built, profile.build)
            profile = replace(profile, build=built)
            print(profile_table(profile))
            meta["profile"] = profile.as_dict()
            if miss == drafts[0][0] and (rewinds := rewind_costs(target, k_max + 1, args.context)):
                from app.engine.caches import layout

                meta["rewind"], meta["state_bytes"] = rewinds, layout(target).state
                print(rewind_table(rewinds, meta["state_bytes"]))
        json_path = _json_path(args.json, miss if len(drafts) > 1 else None)
        if args.profile:
            if json_path:
                _write_json(json_path, meta)
            continue

        def save(rows: list[Row], done: int, path: Path | None = json_path) -> None:
            if path is not None:
                meta.update(
                    max_tokens=args.max_tokens,
                    repeats=done,
                    lookup=args.prompt_lookup,
                    fresh_shapes=args.fresh_shapes,
                )
                _write_json(path, meta, [r.as_dict() for r in rows])

        rows = benchmark(
            target,
            draft_model,
            prompts,
            ks=ks,
            temps=temps,
            max_tokens=args.max_tokens,
            repeats=args.repeats,
            impls=impls,
            lookup=args.prompt_lookup,
            warmup=args.warmup,
            log=log,
            profile=profile,
            k_max=k_max,
            draft_cutoff=args.draft_cutoff,
            options=args.engine_options,
            mlx_ks=[int(k) for k in args.mlx_ks.split(",")] if args.mlx_ks else None,
            on_repeat=save,
            fresh_shapes=args.fresh_shapes,
        )
        print(table(rows), flush=True)
        if args.ttft:
            ttft = ttft_by_drafter(target, draft_model, ttft_prompt)
            meta["ttft_first_turn"] = {"prompt_tokens": len(ttft_prompt), **ttft}
            cells = ", ".join(f"{label} {secs:.3f} s" for label, secs in ttft.items())
            print(f"time to first token, {len(ttft_prompt)}-token prompt, cold: {cells}")
        if args.ttft and pair is not None:
            texts = getattr(args, "prompt_texts", None) or default_prompts()
            store = getattr(args, "profiles", None)  # the data folder's, as the CLI checked it
            ttft2 = ttft_cold_and_warm(pair, texts[0], "Now make it shorter.", store=store)
            meta["ttft_turn2"] = ttft2
            print(
                f"time to first token, turn 2 of {ttft2['prompt_tokens']} prompt tokens: "
                f"cold {ttft2['cold_ttft_seconds']:.3f} s, warm {ttft2['warm_ttft_seconds']:.3f} s "
                f"({ttft2['warm_reused_tokens']} tokens reused)"
            )
        save(rows, args.repeats)
        del draft_model
        mx.clear_cache()
    return 0
