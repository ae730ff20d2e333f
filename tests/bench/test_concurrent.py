"""``tandem bench --concurrent``: several requests on one batch against one alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.bench.concurrent import StreamsConfig, measure_streams, streams_table, variants
from app.engine import GenerationParams, load_pair
from app.engine.decoder import Decoder
from app.engine.options import EngineOptions
from app.engine.types import DraftSetting
from tests.conftest import TinyModels
from tests.fakes import _tandem_here

PROMPT = list(range(40, 64))


@pytest.fixture(scope="module")
def pair(tiny: TinyModels):
    return load_pair(tiny.target, tiny.noisy)  # a draft the target partly accepts


def test_variants_differ_only_in_their_last_token() -> None:
    prompts = variants(PROMPT, 4)
    assert prompts[0] == PROMPT
    assert len({tuple(p) for p in prompts}) == 4
    assert all(p[:-1] == PROMPT[:-1] and p[-1] in PROMPT for p in prompts)
    assert variants([5, 6], 3) == [[5, 6], [5, 5], [5, 6]]  # too few tokens: they repeat


def test_one_row_per_stream_count_and_every_greedy_stream_is_exact(pair) -> None:
    rows = measure_streams(
        pair.target.model, pair.draft.model, PROMPT, GenerationParams(drafting=DraftSetting.of(3)),
        streams=(1, 3), max_tokens=20, warmup=False,
    )  # fmt: skip
    assert [r.streams for r in rows] == [1, 3]
    for r in rows:
        assert r.exact is True
        assert r.k == "3" and r.tokens == 20 * r.streams
        assert r.acceptance is not None and 0 < r.acceptance < 1
        assert r.mean_k is not None and 1 <= r.mean_k <= 3
        assert r.total_tps > 0 and r.plain_tps > 0 and r.spec_tps is not None
        assert r.speedup_plain == pytest.approx(r.total_tps / r.plain_tps)
        assert r.speedup_spec == pytest.approx(r.total_tps / r.spec_tps)
        assert r.request_share == pytest.approx(r.request_tps / r.spec_tps)
    lines = streams_table(rows).splitlines()
    assert lines[0].startswith("k 3, temp 0.00; one request alone: plain")
    assert lines[1].split()[0] == "streams" and lines[1].split()[-1] == "exact"
    assert [line.split()[0] for line in lines[2:]] == ["1", "3"]
    assert all(line.split()[-1] == "yes" for line in lines[2:])
    assert lines[1].split()[-3:-1] == ["per", "req"]
    assert [line.split()[-2] for line in lines[2:]] == [f"{r.request_share:.2f}" for r in rows]


@pytest.mark.parametrize(("share", "read"), [(True, 47), (False, 3 * 47)])
def test_streams_copy_the_prompt_rows_they_share_unless_told(
    pair, monkeypatch: pytest.MonkeyPatch, share: bool, read: int
) -> None:
    rows_read: dict[Decoder, int] = {}  # by decoder: the batch's and the references'
    original = Decoder._read_into

    def spy(self, model, chunks, caches):  # type: ignore[no-untyped-def]
        if model is pair.target.model:
            rows_read[self] = rows_read.get(self, 0) + sum(len(c) for _, c in chunks)
        return original(self, model, chunks, caches)

    monkeypatch.setattr(Decoder, "_read_into", spy)
    config = StreamsConfig(
        GenerationParams(drafting=DraftSetting.of(3)), options=EngineOptions(share_prompts=share)
    )
    rows = measure_streams(
        pair.target.model, pair.draft.model, list(range(40, 88)), [config],
        streams=(3,), max_tokens=12, warmup=False,
    )  # fmt: skip
    # The 48-token prompts differ in their last token only; a reference reads one.
    assert max(rows_read.values()) == read
    assert rows[0].exact is True


@pytest.mark.parametrize("fresh", [False, True])
def test_fresh_shapes_warm_up_on_prompts_one_token_longer(
    pair, monkeypatch: pytest.MonkeyPatch, fresh: bool
) -> None:
    seen: dict[Decoder, list[int]] = {}  # prompt lengths by decoder, in order
    original = Decoder.generate

    def generate(self, prompt, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.setdefault(self, []).append(len(prompt))
        return original(self, prompt, *args, **kwargs)

    monkeypatch.setattr(Decoder, "generate", generate)
    rows = measure_streams(
        pair.target.model, pair.draft.model, PROMPT, GenerationParams(drafting=DraftSetting.of(2)),
        streams=(2,), max_tokens=8, fresh=fresh,
    )  # fmt: skip
    assert rows[0].exact is True  # the measured run decoded the prompts asked for
    n = len(PROMPT)
    warm = n + 1 if fresh else n
    runs = list(seen.values())
    assert runs[:2] == [[warm, n], [warm, n]]  # plain alone, speculative alone: warm-up, measured
    assert [warm, warm, n, n] in runs  # the two streams


@pytest.mark.parametrize("fresh", [False, True])
def test_repeats_rotate_the_configurations_and_rows_give_the_median_run(
    pair, monkeypatch: pytest.MonkeyPatch, fresh: bool
) -> None:
    opened: list[tuple[int, int]] = []  # (k, prompt length) of each request, in order
    original = Decoder.generate

    def generate(self, prompt, params, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append((params.drafting.k, len(prompt)))
        return original(self, prompt, params, *args, **kwargs)

    monkeypatch.setattr(Decoder, "generate", generate)
    configs = [StreamsConfig(GenerationParams(drafting=DraftSetting.of(k))) for k in (2, 3)]
    rows = measure_streams(
        pair.target.model, pair.draft.model, PROMPT, configs,
        streams=(2,), max_tokens=8, warmup=False, repeats=3, fresh=fresh,
    )  # fmt: skip
    n = len(PROMPT)
    grow = 2 if fresh else 0  # each repeat's prompts longer: no replayed lengths
    # The references alone first, then the batches of two requests each.
    assert opened[-12:][::2] == [
        (2, n), (3, n), (3, n + grow), (2, n + grow), (2, n + 2 * grow), (3, n + 2 * grow)
    ]  # fmt: skip
    assert [(r.k, r.streams) for r in rows] == [("2", 2), ("3", 2)]
    for r in rows:
        assert len(r.runs_tps) == 3
        assert r.total_tps == pytest.approx(sorted(r.runs_tps)[1])
        assert r.exact is True
    assert streams_table(rows).splitlines()[0].endswith("; median of 3 runs")


def test_the_speculative_reference_keeps_what_it_learned_in_its_warm_up(
    pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[tuple[int, int]] = []  # (decoder, prompt tokens its caches held) per run
    original = Decoder.generate

    def generate(self, prompt, *args, **kwargs):
        if self.draft is not None:
            runs.append((id(self), sum(len(k.tokens) for k in self._kept)))
        return original(self, prompt, *args, **kwargs)

    monkeypatch.setattr(Decoder, "generate", generate)
    measure_streams(
        pair.target.model, pair.draft.model, PROMPT, GenerationParams(),
        streams=(1,), max_tokens=8,
    )  # fmt: skip
    # Warm-up and measured run on one decoder, as the app keeps one per pair,
    # its caches dropped in between: nothing is read from them.
    reference = [held for decoder, held in runs if decoder == runs[0][0]]
    assert len(reference) == 2 and reference[1] == 0


def test_a_stream_that_differs_from_its_solo_reply_is_not_exact(pair) -> None:
    prompts = variants(PROMPT, 2)
    # Greedy replies given as known: the second prompt's is wrong.
    replies = {tuple(prompts[1]): [0] * 12}
    rows = measure_streams(
        pair.target.model, pair.draft.model, PROMPT, GenerationParams(drafting=DraftSetting.of(2)),
        streams=(1, 2), max_tokens=12, warmup=False, replies=replies,
    )  # fmt: skip
    assert [r.exact for r in rows] == [True, False]
    assert tuple(prompts[0]) in replies  # the first one was decoded and kept for later calls


def test_sampled_streams_are_not_checked(pair) -> None:
    rows = measure_streams(
        pair.target.model, pair.draft.model, PROMPT,
        GenerationParams(drafting=DraftSetting.of(None, 4), temperature=0.8),
        streams=(2,), max_tokens=12, warmup=False,
    )  # fmt: skip
    assert rows[0].exact is None and rows[0].k == "auto" and rows[0].temp == 0.8
    assert streams_table(rows).splitlines()[-1].split()[-1] == "-"


@pytest.mark.slow
def test_cli_runs_synthetic_streams_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "streams.json"
    r = _tandem_here(
        "bench", "--synthetic", "tiny:tiny", "--miss", "0", "--concurrent", "1,2",
        "--ks", "4", "--max-tokens", "24", "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["meta"]["synthetic"] == "tiny:tiny" and data["meta"]["concurrent"] == [1, 2]
    assert data["meta"]["max_tokens"] == 24 and "profile" not in data["meta"]  # fixed k
    rows = data["rows"]
    assert [row["streams"] for row in rows] == [1, 2]
    assert all(row["exact"] is True and row["acceptance"] == 1.0 for row in rows)  # miss 0
    assert all(row["tokens"] == 24 * row["streams"] for row in rows)
    assert "one request alone" in r.stdout and "speedup" not in r.stdout  # no plain bench


@pytest.mark.parametrize(("flags", "side_by_side"), [([], True), (["--no-side-by-side"], False)])
def test_cli_runs_streams_side_by_side_unless_told_and_records_it(
    tmp_path: Path, flags: list[str], side_by_side: bool
) -> None:
    out = tmp_path / "streams.json"
    r = _tandem_here(
        "bench", "--synthetic", "tiny:tiny", "--miss", "0.2", "--concurrent", "3",
        "--ks", "4", "--max-tokens", "24", *flags, "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["meta"]["side_by_side"] is side_by_side
    assert data["meta"]["fresh_shapes"] is False
    assert [row["exact"] for row in data["rows"]] == [True]


@pytest.mark.slow
def test_cli_runs_streams_on_model_folders(tiny: TinyModels, tmp_path: Path) -> None:
    out = tmp_path / "streams.json"
    r = _tandem_here(
        "bench", "--model", str(tiny.target), "--draft", str(tiny.noisy), "--concurrent", "2",
        "--ks", "2,auto", "--max-tokens", "12", "--context", "32", "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert [(row["k"], row["streams"]) for row in data["rows"]] == [("2", 2), ("auto", 2)]
    assert all(row["exact"] is True for row in data["rows"])
    assert data["meta"]["profile"]["verify"]  # Auto starts from the measured costs


def test_cli_refuses_a_stream_count_below_one() -> None:
    r = _tandem_here("bench", "--synthetic", "tiny:tiny", "--concurrent", "0,2")
    assert r.returncode == 2
    assert "--concurrent takes whole numbers from 1" in r.stderr
