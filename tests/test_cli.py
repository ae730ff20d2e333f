from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TinyModels
from tests.fakes import _tandem, _tandem_here, _tandem_in, _tandem_in_here


def test_generate_json(tiny: TinyModels) -> None:
    r = _tandem_here(
        "generate",
        "--model",
        str(tiny.target),
        "--draft",
        str(tiny.copy),
        "--num-draft",
        "3",
        "--max-tokens",
        "12",
        "--json",
        "Hello",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("text", "token_ids", "drafted", "accepted", "acceptance", "generation_tps"):
        assert key in out
    assert out["finish_reason"] in {"stop", "length"}
    assert out["accepted"] == out["drafted"] > 0
    assert len(out["token_ids"]) <= 12
    assert len(out["origins"]) == len(out["token_ids"])


def test_generate_streams_text(tiny: TinyModels, tiny_pair) -> None:
    r = _tandem_here("generate", "--model", str(tiny.target), "--max-tokens", "8", "Hi")
    assert r.returncode == 0, r.stderr
    assert "tok/s" in r.stderr
    assert r.stdout.endswith("\n")


def test_greedy_cli_matches_with_and_without_draft(tiny: TinyModels) -> None:
    common = ("--max-tokens", "20", "--json", "Say something")
    plain = json.loads(_tandem_here("generate", "--model", str(tiny.target), *common).stdout)
    spec = json.loads(
        _tandem_here(
            "generate", "--model", str(tiny.target), "--draft", str(tiny.draft), *common
        ).stdout
    )
    assert spec["token_ids"] == plain["token_ids"]


@pytest.mark.parametrize(
    ("folder", "code", "reason"),
    [("missing", 1, "no such folder"), ("empty", 1, "no config.json")],
)
def test_bad_folder_exits_with_one_line(tmp_path: Path, folder, code, reason) -> None:
    (tmp_path / "empty").mkdir()
    r = _tandem("generate", "--model", str(tmp_path / folder), "Hi")
    assert r.returncode == code
    assert reason in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_incompatible_pair_exits_2(tiny: TinyModels) -> None:
    r = _tandem("generate", "--model", str(tiny.target), "--draft", str(tiny.foreign), "Hi")
    assert r.returncode == 2
    assert "cannot draft for" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_version() -> None:
    r = _tandem("--version")
    assert r.returncode == 0
    assert r.stdout.startswith("tandem ")


def test_generate_with_auto_k_and_sampling_options(tiny: TinyModels) -> None:
    r = _tandem_here(
        "generate",
        "--model",
        str(tiny.target),
        "--draft",
        str(tiny.copy),
        "--num-draft",
        "auto",
        "--k-max",
        "5",
        "--temp",
        "0.8",
        "--top-p",
        "0.9",
        "--top-k",
        "50",
        "--min-p",
        "0.01",
        "--repetition-penalty",
        "1.1",
        # Seeded, so the reply surely drafts and starts with the plain step
        # that measures the baseline.
        "--seed",
        "6",
        "--max-tokens",
        "500",
        "--json",
        "Say something twice",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["num_draft"] is None
    assert 1 <= out["k_min"] <= out["k_max"] <= 5
    assert out["accepted"] == out["drafted"] > 0  # the draft is the target
    assert out["baseline_tps"] > 0


def test_match_rule_is_selectable(tiny: TinyModels) -> None:
    common = ("--model", str(tiny.target), "--draft", str(tiny.copy), "--temp", "1.0")
    # Unseeded: a seeded reply is drafted against its own draws, whatever the rule.
    args = ("--accept-rule", "match", "--max-tokens", "40", "--json", "Hi")
    drafted = accepted = 0
    for _ in range(5):  # an unseeded reply may end at once
        r = _tandem_here("generate", *common, *args)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        drafted, accepted = drafted + out["drafted"], accepted + out["accepted"]
        if drafted > 10:
            break
    assert drafted > 0
    # Two independent samples of the same distribution rarely agree every time.
    assert accepted < drafted


def test_bad_num_draft_is_refused() -> None:
    r = _tandem("generate", "--model", "x", "--num-draft", "many", "Hi")
    assert r.returncode == 2
    assert "--num-draft" in r.stderr


@pytest.mark.slow
def test_check_pair_exit_codes(tiny: TinyModels, small_draft: Path, tmp_path: Path) -> None:

    ok = _tandem_here("check-pair", str(tiny.target), str(small_draft))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith("compatible")
    bad = _tandem_here("check-pair", str(tiny.target), str(tiny.foreign), "--json")
    assert bad.returncode == 2
    verdict = json.loads(bad.stdout)
    assert verdict["compatible"] is False
    assert any(c["name"] == "token texts" and not c["ok"] for c in verdict["checks"])
    broken = _tandem("check-pair", str(tiny.target), str(tmp_path / "missing"))
    assert broken.returncode == 1
    assert len(broken.stderr.strip().splitlines()) == 1
    assert "Traceback" not in broken.stderr


@pytest.mark.slow
def test_models_list_and_delete(tiny: TinyModels, tmp_path: Path) -> None:
    import shutil

    models = tmp_path / "data" / "Tandem" / "models"
    models.mkdir(parents=True)
    shutil.copytree(tiny.target, models / "tiny-llama")
    (models / "broken").mkdir()
    listed = json.loads(_tandem_in_here(tmp_path, "models", "list", "--json").stdout)
    by_name = {m["name"]: m for m in listed}
    assert by_name["tiny-llama"]["architecture"] == "llama"
    assert by_name["tiny-llama"]["problem"] is None
    assert "config.json" in by_name["broken"]["problem"]
    text = _tandem_in_here(tmp_path, "models", "list").stdout
    assert "tiny-llama  llama" in text
    kept = _tandem_in_here(tmp_path, "models", "delete", "tiny-llama", stdin="n\n")
    assert kept.returncode == 1 and (models / "tiny-llama").exists()
    gone = _tandem_in_here(tmp_path, "models", "delete", "tiny-llama", "--yes")
    assert gone.returncode == 0, gone.stderr
    assert "freeing" in gone.stdout
    assert not (models / "tiny-llama").exists()
    missing = _tandem_in_here(tmp_path, "models", "delete", "nope", "--yes")
    assert missing.returncode == 1


@pytest.mark.slow
def test_models_import_gguf_then_generate(tiny: TinyModels, tmp_path: Path) -> None:
    from tests.fakes import tiny_tokenizer, weights_of, write_gguf

    config = json.loads((tiny.target / "config.json").read_text())
    gguf = write_gguf(
        tmp_path / "tiny-llama.gguf", config, weights_of(tiny.target), tiny_tokenizer(tiny.target)
    )
    r = _tandem_in_here(tmp_path, "models", "import", str(gguf))
    assert r.returncode == 0, r.stderr
    folder = Path(r.stdout.strip())
    assert folder == tmp_path / "data" / "Tandem" / "models" / "tiny-llama"
    listed = json.loads(_tandem_in_here(tmp_path, "models", "list", "--json").stdout)
    assert [m["name"] for m in listed] == ["tiny-llama"]
    common = ("--max-tokens", "12", "--json", "Hello")
    imported = json.loads(_tandem_here("generate", "--model", str(folder), *common).stdout)
    original = json.loads(_tandem_here("generate", "--model", str(tiny.target), *common).stdout)
    assert imported["token_ids"] == original["token_ids"]
    again = _tandem_in_here(tmp_path, "models", "import", str(gguf))
    assert again.returncode == 1
    assert "exists" in again.stderr
    assert "Traceback" not in again.stderr


def test_models_import_quantizes_a_folder_and_says_what_it_cannot(
    tiny: TinyModels, tmp_path: Path
) -> None:
    r = _tandem_in_here(tmp_path, "models", "import", str(tiny.target), "--q-bits", "8")
    assert r.returncode == 0, r.stderr
    out = Path(r.stdout.strip())  # the folder alone: nothing else on stdout
    assert out == tmp_path / "data" / "Tandem" / "models" / "tiny-llama-8bit"
    assert json.loads((out / "config.json").read_text())["quantization"]["bits"] == 8
    again = _tandem_in_here(tmp_path, "models", "import", str(out), "--q-bits", "4")
    assert again.returncode == 1
    assert again.stderr.splitlines()[-1] == (
        "tandem: tiny-llama-8bit is already quantized (8-bit); import it as it is"
    )
    link = ("models", "import", str(tiny.target), "--link")
    assert _tandem_in_here(tmp_path, *link, "--q-bits", "4").stderr == (
        "tandem: --link uses the folder as it is: leave out --q-bits\n"
    )
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    linked_file = _tandem_in_here(tmp_path, "models", "import", str(gguf), "--link")
    assert linked_file.returncode == 2
    assert linked_file.stderr == "tandem: --link: only a model folder can be linked\n"
    listed = json.loads(_tandem_in_here(tmp_path, "models", "list", "--json").stdout)
    assert [m["name"] for m in listed] == ["tiny-llama-8bit"]


def test_token_without_a_keychain_says_why(tmp_path: Path) -> None:
    env_backend = {"PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring"}
    r = subprocess.run(
        [sys.executable, "-m", "app", "token", "status"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env_backend},
    )
    assert r.returncode == 1
    assert r.stderr.startswith("tandem: the token cannot be stored:")
    assert len(r.stderr.strip().splitlines()) == 1


def test_download_offline_is_one_line(tmp_path: Path) -> None:
    r = _tandem_in(tmp_path, "models", "download", "mlx-community/Some-Model-4bit")
    assert r.returncode == 1
    assert "no network" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "data" / "Tandem" / "models" / "mlx-community--Some-Model-4bit").exists()


def test_a_target_drafts_with_its_own_mtp_head(tiny: TinyModels, tmp_path: Path) -> None:
    from tests.engine.families import mtp_model

    target = str(mtp_model(tmp_path / "qwen3.5", tiny.target))
    common = ("--model", target, "--max-tokens", "16", "--temp", "0", "--json", "Say something")
    plain = json.loads(_tandem_here("generate", *common).stdout)
    r = _tandem_here("generate", "--draft", "mtp", "--num-draft", "3", *common)
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)
    assert spec["token_ids"] == plain["token_ids"]
    assert spec["drafted"] > 0
    # A folder named mtp is given as ./mtp; a target without a head says so in one line.
    r = _tandem_here("generate", "--model", str(tiny.target), "--draft", "mtp", "Hi")
    assert r.returncode == 1
    assert r.stderr.strip() == (
        f"tandem: {tiny.target.name} carries no MTP head Tandem drafts with "
        "(Qwen3.5 / 3.6, Qwen3-Next, GLM-4.5 / 4.6 / 4.7 / 4.7-Flash / 5, DeepSeek-V3 / V3.2, "
        "MiMo, MiMo-V2-Flash, Nemotron-H)"
    )


def test_check_pair_judges_a_targets_own_mtp_head(tiny: TinyModels, tmp_path: Path) -> None:
    from tests.engine.families import mtp_model

    target = str(mtp_model(tmp_path / "qwen3.5", tiny.target))
    r = _tandem_here("check-pair", target, "mtp")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(
        "compatible\n  ✓ MTP head: the target drafts with its own multi-token-prediction head"
    )
    r = _tandem_here("check-pair", str(tiny.target), "mtp")
    assert r.returncode == 2
    name = tiny.target.name
    assert r.stdout.startswith(
        f"incompatible: its own MTP head cannot draft for {name}: {name} carries no MTP head"
    )
    # serve refuses it before loading any weight, in the same words.
    r = _tandem_here("serve", "--model", str(tiny.target), "--draft", "mtp", "--port", "0")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"tandem: its own MTP head cannot draft for {name}: {name} carries no MTP head "
        "Tandem drafts with (Qwen3.5 / 3.6, Qwen3-Next, GLM-4.5 / 4.6 / 4.7 / 4.7-Flash / 5, "
        "DeepSeek-V3 / V3.2, MiMo, MiMo-V2-Flash, Nemotron-H)"
    )
