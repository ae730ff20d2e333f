"""Calibration: sweep the draft length k on a loaded pair and find the fastest.

The sweep runs :func:`~app.engine.generate.stream_reply` exactly as a chat turn
does, for each k over the same prompts, so the numbers are the ones the user
will see. It is a generator of immutable events, like ``stream_reply``: the
caller runs it on the engine thread and forwards the events to the UI.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app import resource_path
from app.engine.costs import (
    K_MAX,
    PLAIN_QUEUED,
    CostProfile,
    Plan,
    ProfileProgress,
    plan_round,
)
from app.engine.costs import predicted_rates as _predicted_rates
from app.engine.decoder import Decoder
from app.engine.generate import new_decoder, stream_reply
from app.engine.loader import ModelPair
from app.engine.types import Chunk, DraftSetting, Finished, GenerationParams, Message, Stats
from app.files import write_atomic

DEFAULT_K_MAX = K_MAX
WARMUP_TOKENS = 8
# The full sweep's draft lengths, then auto: every short k, then every second one up
# to the longest, so a slow Mac finishes in minutes.
SWEEP_KS: tuple[int | None, ...] = (0, 1, 2, 3, 4, 5, 6, *range(8, K_MAX + 1, 2), None)
SWEEP_TOKENS = 64
# The quick sweep: one prompt, short runs, plain against one guess and auto.
QUICK_TOKENS = 24
COST_REPEATS = 2  # timed forwards of each width, after the one that builds kernels


def default_prompts() -> list[str]:
    """The built-in prompts (``resources/prompts.json``) that Tune… and ``tandem bench`` use."""
    return [p["prompt"] for p in json.loads(resource_path("prompts.json").read_text())]


@dataclass(frozen=True, slots=True)
class CalibrationPoint:
    """The measurements of one draft length over all prompts.

    Attributes:
        k: The draft length; 0 is plain decoding and ``None`` adaptive ("auto").
        tps: Generated tokens over generation seconds, all prompts together.
        acceptance: Accepted over drafted tokens; ``None`` when nothing was drafted.
        mean_k: The k chosen per drafting round; ``None`` without drafting rounds.
        tokens: Tokens generated over all prompts.
        seconds: Generation seconds over all prompts (prompt processing left out).
    """

    k: int | None
    tps: float
    acceptance: float | None
    mean_k: float | None
    tokens: int
    seconds: float

    @property
    def label(self) -> str:
        """``"auto"`` or the k, for tables and legends."""
        return "auto" if self.k is None else str(self.k)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibrationPoint:
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """What a sweep runs: its prompts, draft lengths and the token budget of each run.

    Attributes:
        prompts: User messages, each a fresh one-message chat.
        ks: Draft lengths: 0 is plain decoding, ``None`` adaptive.
        max_tokens: Token budget of each run.
    """

    prompts: tuple[str, ...]
    ks: tuple[int | None, ...]
    max_tokens: int = SWEEP_TOKENS

    @classmethod
    def full(cls, prompts: Sequence[str]) -> SweepPlan:
        """Every k of :data:`SWEEP_KS` on every prompt."""
        return cls(tuple(prompts), SWEEP_KS, SWEEP_TOKENS)

    @classmethod
    def quick(cls, prompts: Sequence[str], guess_k: int) -> SweepPlan:
        """Plain decoding, ``guess_k`` and auto on the first prompt, in short runs."""
        guess = min(max(guess_k, 1), K_MAX)
        return cls(tuple(prompts[:1]), (0, guess, None), QUICK_TOKENS)

    @property
    def runs(self) -> int:
        """Measured runs: every distinct k on every prompt."""
        return len(dict.fromkeys(self.ks)) * len(self.prompts)

    def seconds(self, plain_tps: float | None) -> float | None:
        """The longest the runs should take at ``plain_tps``: warm-up and runs decoded plain.

        Drafting only makes runs faster, so this errs on the long side; prompt
        reading and the cost measurement (:meth:`cost_seconds`) are left out.
        """
        warmup = len(dict.fromkeys(self.ks)) * min(WARMUP_TOKENS, self.max_tokens)
        return seconds_for(self.runs * self.max_tokens + warmup, plain_tps)

    @property
    def widths(self) -> int:
        """Verification widths the sweep measures first: 1 to its longest k + 1."""
        return max((k for k in self.ks if k), default=DEFAULT_K_MAX) + 1

    @property
    def cost_passes(self) -> int:
        """Target forwards the cost measurement runs (the plain steps; each wider width, then
        its repeats)."""
        return PLAIN_QUEUED + (self.widths - 1) * (1 + COST_REPEATS)

    def cost_seconds(self, verify: Sequence[float | None] | None) -> float | None:
        """What measuring the costs takes, from ``verify`` measured before; ``None`` unknown."""
        known = list(verify or ())[: self.widths]
        if len(known) < self.widths or any(v is None for v in known):
            return None
        step, *wider = known
        return PLAIN_QUEUED * (step or 0.0) + (1 + COST_REPEATS) * sum(v or 0.0 for v in wider)


def seconds_for(tokens: int, plain_tps: float | None) -> float | None:
    """Seconds to decode ``tokens`` at ``plain_tps``; ``None`` while the speed is unknown."""
    return tokens / plain_tps if plain_tps and plain_tps > 0 else None


@dataclass(frozen=True, slots=True)
class CalibrationProgress:
    """Sent before each measured run (and once before the warm-up), and within a run.

    Attributes:
        done: Runs finished so far.
        total: Runs of the whole sweep.
        text: What runs next, for a status line.
        run_done: Tokens the current run has decoded (0 before it starts).
        run_total: The current run's token budget (0 outside measured runs).
        seconds_left: The longest the rest should take at the plain speed;
            ``None`` while that speed is unknown.
    """

    done: int
    total: int
    text: str
    run_done: int = 0
    run_total: int = 0
    seconds_left: float | None = None


@dataclass(frozen=True, slots=True)
class CalibrationResult:
    """The outcome of a sweep.

    Attributes:
        points: One point per k, in the order they were asked for.
        best_k: The fixed k (0 included) with the highest speed; ties go to
            the smaller k. Never ``None``, so it can be stored as a setting.
        baseline_tps: Plain decoding speed: the k = 0 point when measured,
            else the decoder's own estimate, else ``None``.
        prompts: Prompts each k ran on.
        max_tokens: Token budget of each run.
        pair: Label of the pair, for the export.
        profile: The verification costs measured before the sweep.
        accept: Per-position acceptance the sweep observed (greedy).
        k_max: Longest draft Auto may choose.
    """

    points: tuple[CalibrationPoint, ...]
    best_k: int
    baseline_tps: float | None
    prompts: int
    max_tokens: int
    pair: str = ""
    profile: CostProfile | None = None
    accept: tuple[float, ...] = ()
    k_max: int = DEFAULT_K_MAX

    @property
    def auto_plan(self) -> Plan | None:
        """The k Auto picks from this profile and acceptance, and why."""
        if self.profile is None or not self.accept:
            return None
        return plan_round(self.profile, self.accept, self.k_max)

    def predicted(self) -> list[Plan]:
        """Expected tokens per second of every fixed k, from the profile."""
        if self.profile is None or not self.accept:
            return []
        return _predicted_rates(self.profile, self.accept, self.k_max)

    def point(self, k: int | None) -> CalibrationPoint | None:
        """The point of ``k`` (``None`` for auto), if it was measured."""
        return next((p for p in self.points if p.k == k), None)

    @property
    def best(self) -> CalibrationPoint:
        """The point of :attr:`best_k`."""
        point = self.point(self.best_k)
        assert point is not None
        return point

    def speedup(self, point: CalibrationPoint) -> float | None:
        """``point``'s speed over plain decoding, when both are known."""
        if not self.baseline_tps or not point.tps:
            return None
        return point.tps / self.baseline_tps

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able values; :meth:`from_dict` reads them back."""
        return {
            "pair": self.pair,
            "best_k": self.best_k,
            "baseline_tps": self.baseline_tps,
            "prompts": self.prompts,
            "max_tokens": self.max_tokens,
            "points": [{**p.as_dict(), "speedup": self.speedup(p)} for p in self.points],
            "profile": self.profile.as_dict() if self.profile is not None else None,
            "accept": list(self.accept),
            "k_max": self.k_max,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibrationResult:
        return cls(
            points=tuple(CalibrationPoint.from_dict(p) for p in data["points"]),
            best_k=int(data["best_k"]),
            baseline_tps=data.get("baseline_tps"),
            prompts=int(data["prompts"]),
            max_tokens=int(data["max_tokens"]),
            pair=str(data.get("pair", "")),
            profile=CostProfile.from_dict(data["profile"]) if data.get("profile") else None,
            accept=tuple(float(a) for a in data.get("accept") or ()),
            k_max=int(data.get("k_max", DEFAULT_K_MAX)),
        )


def save_json(result: CalibrationResult, path: Path | str) -> None:
    """Writes ``result`` as JSON so that readers see the old or the new file, never half."""
    write_atomic(Path(path), json.dumps(result.as_dict(), indent=2).encode("utf-8"))


def load_json(path: Path | str) -> CalibrationResult:
    """Reads a result that :func:`save_json` wrote."""
    return CalibrationResult.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def recent_prompts(recent: Sequence[str], limit: int = 5) -> list[str]:
    """The last ``limit`` distinct non-blank prompts of ``recent`` (oldest first)."""
    out: list[str] = []
    for text in reversed(recent):
        text = text.strip()
        if text and text not in out:
            out.append(text)
        if len(out) == limit:
            break
    return out[::-1]


def prompt_set(recent: Sequence[str], limit: int = 5) -> list[str]:
    """Prompts to calibrate on: the user's own, else the built-in set.

    Args:
        recent: The user's prompts, oldest first.
        limit: Most prompts to return.

    Returns:
        The last ``limit`` distinct non-blank prompts of ``recent``, or the
        first ``limit`` of ``resources/prompts.json`` when fewer than two remain
        (one prompt says too little about a workload).
    """
    own = recent_prompts(recent, limit)
    return own if len(own) >= 2 else default_prompts()[:limit]


def pick_best(points: Sequence[CalibrationPoint]) -> int:
    """The fixed k with the highest speed; ties go to the smaller k.

    Raises:
        ValueError: No point has a fixed k.
    """
    fixed = [p for p in points if p.k is not None]
    if not fixed:
        raise ValueError("no fixed draft length was measured")
    best = max(fixed, key=lambda p: (p.tps, -(p.k or 0)))
    assert best.k is not None
    return best.k


def calibrate(
    pair: ModelPair,
    prompts: Sequence[str],
    ks: Sequence[int | None],
    *,
    max_tokens: int = 64,
    temperature: float = 0.0,
    seed: int = 0,
    cancel: threading.Event | None = None,
    decoder: Decoder | None = None,
    progress_every: float | None = None,
) -> Iterator[CalibrationProgress | CalibrationResult]:
    """Measures decoding speed for each draft length in ``ks``.

    Every k runs on every prompt as a fresh one-message chat. A short warm-up
    run of each k comes first and is not measured, so the first k does not pay
    for kernel compilation and cache allocation. With ``decoder`` (the one chat
    uses) the fresh profile becomes chat's, and its caches afterwards hold a
    calibration prompt.

    Args:
        pair: A loaded pair with a draft model.
        prompts: User messages to run.
        ks: Draft lengths: 0 is plain decoding, ``None`` adaptive. Duplicates
            are measured once.
        max_tokens: Token budget of each run.
        temperature: Sampling temperature; 0 is greedy.
        seed: Sampler seed of every run, so each k sees the same draws.
        cancel: Checked before every run and between rounds; once set, the
            sweep ends without a result.
        progress_every: Within a measured run, a progress event at most this
            often (seconds), between rounds; ``None`` sends none within runs.

    Yields:
        A :class:`CalibrationProgress` before the warm-up, before each measured
        run and (with ``progress_every``) within it, then one
        :class:`CalibrationResult`.

    Raises:
        ValueError: ``prompts`` or ``ks`` is empty, ``ks`` has no fixed k or
            a negative one, or the pair has no draft model (raised at once,
            not on the first ``next``).
        ModelError: The pair cannot draft (from ``stream_reply``).
    """
    prompts = [p for p in prompts if p.strip()]
    ks = list(dict.fromkeys(ks))
    if not prompts:
        raise ValueError("calibration needs at least one prompt")
    if not ks:
        raise ValueError("calibration needs at least one draft length")
    if all(k is None for k in ks):
        raise ValueError("calibration needs at least one fixed draft length")
    if any(k is not None and k < 0 for k in ks):
        raise ValueError("draft lengths cannot be negative")
    if pair.draft is None:
        raise ValueError("calibration needs a draft model")
    decoder = decoder if decoder is not None else new_decoder(pair)
    return _sweep(pair, decoder, prompts, ks, max_tokens, temperature, seed, cancel, progress_every)


def _sweep(
    pair: ModelPair,
    decoder: Decoder,
    prompts: list[str],
    ks: list[int | None],
    max_tokens: int,
    temperature: float,
    seed: int,
    cancel: threading.Event | None,
    progress_every: float | None,
) -> Iterator[CalibrationProgress | CalibrationResult]:
    # Auto adapts within [1, k_max]; give it the sweep's range to choose from.
    k_max = max((k for k in ks if k), default=DEFAULT_K_MAX)
    total = len(ks) * len(prompts)
    plain_tps = decoder.baseline_tps  # a chat before may have measured it
    done = 0

    def progress(text: str, run_done: int = 0, run_total: int = 0) -> CalibrationProgress:
        left = (total - done) * max_tokens - run_done
        return CalibrationProgress(
            done, total, text, run_done, run_total, seconds_for(left, plain_tps)
        )

    def run(
        k: int | None, prompt: str, tokens: int, text: str | None = None
    ) -> Generator[CalibrationProgress, None, Stats | None]:
        params = GenerationParams(
            drafting=DraftSetting.of(k, k_max),
            max_tokens=tokens,
            temperature=temperature,
            seed=seed,
        )
        last = None
        made, shown = 0, time.monotonic()
        messages = [Message("user", prompt)]
        for event in stream_reply(pair, messages, params, cancel, decoder=decoder):
            last = event
            if text is None or progress_every is None or not isinstance(event, Chunk):
                continue
            made += len(event.token_ids)
            # Between rounds, and seldom: each event crosses to the UI thread.
            if time.monotonic() - shown >= progress_every:
                shown = time.monotonic()
                yield progress(text, min(made, tokens), tokens)
        assert isinstance(last, Finished)
        return None if last.finish_reason == "cancelled" else last.stats

    def cancelled() -> bool:
        return cancel is not None and cancel.is_set()

    if cancelled():
        return
    # Verification costs first: they explain the sweep and Auto plans with them.
    profile: CostProfile | None = None
    widths = k_max + 1
    for event in decoder.measure_costs(widths, COST_REPEATS, cancel):
        if isinstance(event, ProfileProgress):
            yield CalibrationProgress(0, total, f"measuring costs: {event.text}")
        else:
            profile = event
    if cancelled() or profile is None:
        return
    decoder.costs.replace(profile)
    yield progress("warming up")
    for k in ks:
        if cancelled() or (yield from run(k, prompts[0], min(WARMUP_TOKENS, max_tokens))) is None:
            return

    points: list[CalibrationPoint] = []
    baseline: float | None = None
    for k in ks:
        runs: list[Stats] = []
        for i, prompt in enumerate(prompts):
            if cancelled():
                return
            label = "auto" if k is None else str(k)
            text = f"k = {label}, prompt {i + 1} of {len(prompts)}"
            yield progress(text, 0, max_tokens)
            # A cancel set in answer to the event ends the run before its prefill.
            stats = yield from run(k, prompt, max_tokens, text)
            if stats is None:
                return
            runs.append(stats)
            baseline = stats.baseline_tps or baseline
            # The plain speed the rest is estimated at: measured, else this first run's.
            first = stats.tokens / stats.generation_seconds if stats.generation_seconds else None
            plain_tps = baseline or plain_tps or first
            done += 1
        points.append(_point(k, runs))
    if cancelled():
        return
    plain = next((p for p in points if p.k == 0), None)
    yield CalibrationResult(
        points=tuple(points),
        best_k=pick_best(points),
        baseline_tps=plain.tps if plain is not None else baseline,
        prompts=len(prompts),
        max_tokens=max_tokens,
        pair=pair.label,
        profile=decoder.costs.profile(),
        accept=decoder.acceptance(temperature > 0).rates(),
        k_max=k_max,
    )


def _point(k: int | None, runs: Sequence[Stats]) -> CalibrationPoint:
    """Aggregates runs as totals, so long replies weigh more than short ones."""
    tokens = sum(s.tokens for s in runs)
    seconds = sum(s.generation_seconds for s in runs)
    drafted = sum(s.drafted for s in runs)
    rounds = sum(s.draft_rounds for s in runs)
    chosen = sum(s.k_sum for s in runs)
    return CalibrationPoint(
        k=k,
        tps=tokens / seconds if seconds > 0 else 0.0,
        acceptance=sum(s.accepted for s in runs) / drafted if drafted else None,
        mean_k=chosen / rounds if rounds else None,
        tokens=tokens,
        seconds=seconds,
    )
