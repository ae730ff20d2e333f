"""``tandem bench`` runs end to end on tiny models (numbers are reported, not asserted)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TinyModels
from tests.fakes import _tandem_here

# Each test runs `tandem bench` through the CLI's main(), in this process (which has
# MLX imported already): up to a few seconds apiece.
pytestmark = pytest.mark.slow


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return _tandem_here("bench", *args)


def test_synthetic_bench_writes_rows(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    r = _bench(
        "--synthetic",
        "tiny:tiny",
        "--miss",
        "0.25",
        "--ks",
        "0,2,auto",
        "--temps",
        "0,0.7",
        "--max-tokens",
        "24",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["meta"]["synthetic"] == "tiny:tiny"
    rows = {(row["impl"], row["k"], row["temp"]) for row in data["rows"]}
    for temp in (0.0, 0.7):
        assert {("plain", "0", temp), ("mlx-lm", "2", temp), ("tandem", "2", temp)} <= rows
        assert ("tandem", "auto", temp) in rows
    greedy = {(row["impl"], row["k"]): row for row in data["rows"] if row["temp"] == 0}
    for impl in ("tandem", "mlx-lm"):
        assert 0 < greedy[(impl, "2")]["acceptance"] < 1  # a quarter of drafts miss
        assert greedy[(impl, "2")]["tokens_per_call"] > 1
    assert greedy[("plain", "0")]["speedup"] == 1.0
    assert "speedup" in r.stdout


def test_bench_on_model_folders_reports_ttft(tiny: TinyModels, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Write a haiku.\nSay hello.\n")
    out = tmp_path / "bench.json"
    r = _bench(
        "--model",
        str(tiny.target),
        "--draft",
        str(tiny.noisy),
        "--ks",
        "3",
        "--prompts",
        str(prompts),
        "--max-tokens",
        "16",
        "--ttft",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    meta = json.loads(out.read_text())["meta"]
    first = meta["ttft_first_turn"]
    assert {"plain", "draft", "lookup", "lookup+draft"} <= first.keys()
    assert all(first[k] > 0 for k in ("plain", "draft"))
    ttft = meta["ttft_turn2"]
    assert ttft["warm_reused_tokens"] > 0
    assert ttft["cold_reused_tokens"] == 0
    assert meta["prompts"] == 2


def test_bench_rejects_unknown_shapes() -> None:
    r = _bench("--synthetic", "tiny:huge")
    assert r.returncode == 2
    assert "unknown shape 'huge'" in r.stderr


def test_bench_profile_prints_the_verify_cost_of_each_width(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    r = _bench(
        "--synthetic", "tiny-llama:tiny-llama", "--bits", "4", "--ks", "0,4,auto", "--profile",
        "--context", "64", "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["m", "ms", "steps"]
    assert [line.split()[0] for line in lines[1:6]] == ["1", "2", "3", "4", "5"]
    assert "draft step" in r.stdout and "speedup" not in r.stdout  # the table, no runs
    profile = json.loads(out.read_text())["meta"]["profile"]
    assert len(profile["verify"]) == 5 and all(v > 0 for v in profile["verify"])


def test_bench_refuses_a_draft_longer_than_16() -> None:
    r = _bench("--synthetic", "tiny:tiny", "--ks", "4,17")
    assert r.returncode == 2
    assert "from 0 to 16" in r.stderr


def test_several_miss_rates_share_one_target_and_keep_a_file_each(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    r = _bench(
        "--synthetic", "tiny:tiny", "--miss", "0,0.5", "--ks", "4,auto", "--impls",
        "plain,tandem", "--max-tokens", "24", "--warmup", "8", "--context", "32",
        "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("building") == 1 and "== miss 0.5" in r.stdout
    runs = {m: json.loads((tmp_path / f"bench-miss{m}.json").read_text()) for m in ("0", "0.5")}
    acceptance = {}
    for m, data in runs.items():
        assert data["meta"]["miss"] == float(m)
        rows = {row["k"]: row for row in data["rows"]}
        acceptance[m] = rows["4"]["acceptance"]
        # Each drafting round's k, width and time, and the costs the decoder learned.
        assert rows["4"]["rounds"] and all(w >= k + 1 for k, w, *_ in rows["4"]["rounds"])
        assert rows["auto"]["learned"]["rounds"]
    assert acceptance["0"] == 1.0 and acceptance["0.5"] < 1.0


def test_later_miss_rates_keep_the_kernel_build_the_first_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    from app.bench import bench

    # The second measurement finds its kernels built by the first, and sees no build.
    builds = iter([0.08, 0.0])
    measure = bench._measure
    monkeypatch.setattr(bench, "_measure", lambda *a: replace(measure(*a), build=next(builds)))
    out = tmp_path / "profile.json"
    r = _bench(
        "--synthetic", "tiny:tiny", "--miss", "0,0.5", "--ks", "4", "--profile",
        "--context", "32", "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("a width's first forward builds kernels: 80.0 ms more") == 2
    for m in ("0", "0.5"):
        meta = json.loads((tmp_path / f"profile-miss{m}.json").read_text())["meta"]
        assert meta["profile"]["build"] == 0.08


@pytest.mark.parametrize("pair", ["tiny-llama:tiny-llama", "tiny-hybrid:tiny-hybrid"])
def test_batch_profile_times_several_sequences_batched_and_joint(tmp_path: Path, pair) -> None:
    out = tmp_path / "batch.json"
    r = _bench("--synthetic", pair, "--batch-profile", "--context", "32", "--json", str(out))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    stacked = " / stacked" if pair.startswith("tiny-llama") else ""
    assert lines[0] == "sequences x new tokens each: ms batched / joint / one by one" + stacked
    assert lines[1].split() == ["B", "m=1", "m=4", "m=8", "m=16"]
    assert [line.split()[0] for line in lines[2:6]] == ["1", "2", "4", "8"]
    costs = json.loads(out.read_text())["meta"]["batch_profile"]
    assert {(c["sequences"], c["rows"]) for c in costs} == {
        (b, m) for b in (1, 2, 4, 8) for m in (1, 4, 8, 16)
    }
    assert all(c["batched"] > 0 and c["packed"] > 0 and c["separate"] > 0 for c in costs)
    steps = json.loads(out.read_text())["meta"]["draft_batch_profile"]
    assert {(c["sequences"], c["rows"]) for c in steps} == {(b, 1) for b in (1, 2, 4, 8)}
    # Side by side too, as the batch's draft steps after a round's first run (Llama kind).
    assert all((c["stacked"] is None) == (c["sequences"] == 1 or not stacked) for c in steps)
    assert "the draft's step:" in lines


def test_bench_refuses_a_miss_rate_out_of_range() -> None:
    r = _bench("--synthetic", "tiny:tiny", "--miss", "0,1.5")
    assert r.returncode == 2
    assert "--miss takes rates from 0 to 1" in r.stderr


VARIANTS = ["auto-pooled", "auto-cutoff", "auto-uncut"]  # Auto run another way


def test_auto_run_other_ways_runs_side_by_side_with_auto(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    r = _bench(
        "--synthetic",
        "tiny:tiny",
        "--miss",
        "0.1",
        "--ks",
        ",".join(["0", "auto", *VARIANTS]),
        "--impls",
        "plain,tandem",
        "--max-tokens",
        "24",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    rows = {(row["impl"], row["k"]) for row in data["rows"]}
    assert rows == {("plain", "0"), ("tandem", "auto"), *(("tandem", v) for v in VARIANTS)}
    assert all(v in r.stdout for v in VARIANTS)
    assert data["meta"]["draft_cutoff"] is False  # no --draft-cutoff: each row keeps its own


def test_streams_run_auto_with_and_without_stretches_and_the_draft_cutoff(
    tmp_path: Path,
) -> None:
    out = tmp_path / "streams.json"
    r = _bench(
        "--synthetic", "tiny:tiny", "--miss", "0.1", "--concurrent", "2", "--temps", "0.7",
        "--ks", ",".join(["auto", *VARIANTS]), "--max-tokens", "16", "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [row["k"] for row in rows] == ["auto", *VARIANTS]
    assert all(row["tokens"] == 32 for row in rows)


def test_a_run_cut_short_keeps_the_repeats_it_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.bench.bench as bench

    out = tmp_path / "bench.json"
    calls: list[int] = []
    plain = bench.run_plain

    def stopped_in_the_third_repeat(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 4:  # the warm-up, two repeats, then the time limit strikes
            raise KeyboardInterrupt
        return plain(*args, **kwargs)

    monkeypatch.setattr(bench, "run_plain", stopped_in_the_third_repeat)
    args = ("--synthetic", "tiny:tiny", "--ks", "0,2", "--impls", "plain,tandem")
    with pytest.raises(KeyboardInterrupt):
        _bench(*args, "--max-tokens", "16", "--repeats", "3", "--json", str(out))
    data = json.loads(out.read_text())
    assert data["meta"]["repeats"] == 2
    assert {row["k"]: len(row["tps"]) for row in data["rows"]} == {"0": 2, "2": 2}
    tandem = next(row for row in data["rows"] if row["impl"] == "tandem")
    assert tandem["speedup"] is not None and tandem["learned"] is not None


@pytest.mark.parametrize("fresh", [False, True])
def test_fresh_shapes_give_every_measured_run_a_prompt_of_its_own_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh: bool
) -> None:
    import app.bench.bench as bench

    lengths: dict[str, list[int]] = {"plain": [], "tandem": []}

    def spy(name: str, run: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            prompt = args[1]
            lengths[name].append(len(prompt))
            return run(*args, **kwargs)

        return counted

    monkeypatch.setattr(bench, "run_plain", spy("plain", bench.run_plain))
    monkeypatch.setattr(bench, "run_tandem", spy("tandem", bench.run_tandem))
    out = tmp_path / "bench.json"
    flags = ["--fresh-shapes"] if fresh else []
    r = _bench(
        "--synthetic", "tiny:tiny", "--ks", "2", "--impls", "plain,tandem", "--max-tokens", "8",
        "--repeats", "2", "--cold", "--json", str(out), *flags,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["meta"]["fresh_shapes"] is fresh
    # The warm-up first, then one run per configuration per repeat.
    warm = lengths["plain"][0]
    assert lengths["tandem"][0] == warm
    measured = lengths["plain"][1:] + lengths["tandem"][1:]
    assert len(measured) == 4
    if fresh:
        assert sorted(measured) == [warm + 1, warm + 2, warm + 3, warm + 4]
    else:
        assert measured == [warm] * 4


def test_greedy_rows_say_how_many_replies_were_plain_decodings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    import app.bench.bench as bench

    def one_off(run: Any) -> Any:  # the engine's k = 4 replies end on a wrong token
        def wrong(*args: Any, **kwargs: Any) -> Any:
            out = run(*args, **kwargs)
            if args[4] != 4:
                return out
            return dataclasses.replace(out, tokens=[*out.tokens[:-1], out.tokens[-1] + 1])

        return wrong

    monkeypatch.setattr(bench, "run_tandem", one_off(bench.run_tandem))
    out = tmp_path / "bench.json"
    r = _bench(
        "--synthetic", "tiny:tiny", "--miss", "0.25", "--ks", "2,4,auto", "--temps", "0,0.7",
        "--max-tokens", "16", "--repeats", "2", "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    same = {(row["impl"], row["k"], row["temp"]): row["same_as_plain"] for row in json.loads(
        out.read_text())["rows"]}  # fmt: skip
    assert same[("tandem", "2", 0.0)] == same[("tandem", "auto", 0.0)] == 2
    assert same[("mlx-lm", "2", 0.0)] == 2
    assert same[("tandem", "4", 0.0)] == 0
    assert same[("plain", "0", 0.0)] is None  # the reference itself
    assert same[("tandem", "2", 0.7)] is None  # sampled: nothing to compare
    assert "=plain" in r.stdout and " 0/2" in r.stdout


def test_rows_give_the_rate_of_the_whole_set_beside_the_median_run(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    r = _bench(
        "--synthetic", "tiny:tiny", "--miss", "0.25", "--ks", "2", "--impls", "plain,tandem",
        "--max-tokens", "12", "--repeats", "3", "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    for row in json.loads(out.read_text())["rows"]:
        # Tokens over seconds of all runs: a mean weighted by time, within the runs' range.
        assert row["overall_tps"] == pytest.approx(row["decoded"] / row["seconds"])
        assert min(row["tps"]) <= row["overall_tps"] <= max(row["tps"])
        assert 0 < row["decoded"] < 3 * 12  # each run's first round is not decoding time's
    assert "overall" in r.stdout


def test_wide_sets_the_rows_both_models_dequantize_from(tmp_path: Path) -> None:
    out = tmp_path / "wide.json"
    r = _bench(
        "--synthetic", "tiny:tiny", "--bits", "4", "--ks", "2", "--impls", "tandem",
        "--max-tokens", "8", "--wide", "96", "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    meta = json.loads(out.read_text())["meta"]
    assert (meta["wide"], meta["wide_rows_target"], meta["wide_rows_draft"]) == ("96", 96, 96)
    assert "target: wide forwards dequantize from 96 rows" in r.stderr

    r = _bench("--synthetic", "tiny:tiny", "--wide", "wider")
    assert r.returncode == 2
    assert "--wide takes auto, off or a positive row count, not 'wider'" in r.stderr


def test_mlx_lms_rate_leaves_out_its_whole_first_round_as_tandems_does() -> None:
    """mlx-lm's loop yields a round's tokens one by one, all computed: its first round's
    accepted drafts arrive with its first token and were never decoding time."""
    from app.bench.bench import run_mlx_lm, run_tandem
    from app.engine.decoder import Decoder
    from app.testing import synthetic as syn

    target, draft = syn.build("tiny"), syn.build("tiny")  # the copy's drafts are all accepted
    prompt = syn.prompt("tiny")
    theirs = run_mlx_lm(target, draft, prompt, 24, 0.0, 4)
    assert theirs.first_tokens == 5  # four accepted drafts and the target's token
    ours = run_tandem(Decoder(target, draft), prompt, 24, 0.0, 4)
    assert ours.first_tokens == 1  # a plain first round
    assert theirs.tokens == ours.tokens


def test_a_hybrid_target_s_rewind_is_timed_against_its_verification() -> None:
    from app.bench.bench import rewind_costs
    from app.testing import synthetic as syn

    rows = rewind_costs(syn.build("tiny-hybrid"), widths=9, context=32)
    assert [r["m"] for r in rows] == [2, 5, 9]
    assert all(r["verify_ms"] > 0 and r["rewind_ms"] > 0 for r in rows)
    assert rewind_costs(syn.build("tiny"), widths=9, context=32) == []  # a trim: nothing to time


def test_mlx_lms_loop_on_a_hybrid_target_is_refused_in_one_line() -> None:
    r = _bench("--synthetic", "tiny-hybrid:tiny-hybrid", "--impls", "mlx-lm,tandem")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("tandem: mlx-lm's loop cannot speculate")
    assert "Traceback" not in r.stderr


def test_mlx_lms_loop_is_left_out_on_a_hybrid_target_unless_asked_for(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    r = _bench(
        "--synthetic", "tiny-hybrid:tiny-hybrid", "--ks", "2", "--temps", "0",
        "--max-tokens", "8", "--warmup", "4", "--repeats", "1", "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "(hybrid layers: no trimmable cache): left out" in r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {row["impl"] for row in rows} == {"plain", "tandem"}


def test_bench_runs_a_target_drafting_with_its_own_mtp_head(tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tests.engine.families import mtp_model

    target = mtp_model(tmp_path / "qwen3.5-tiny", tiny.target)
    out = tmp_path / "bench.json"
    r = _bench(
        "--model", str(target), "--draft", "mtp", "--ks", "2", "--temps", "0",
        "--max-tokens", "8", "--warmup", "4", "--repeats", "1", "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {row["impl"] for row in rows} == {"plain", "tandem"}  # mlx-lm's loop left out
    assert json.loads(out.read_text())["meta"]["draft"] == "mtp"
