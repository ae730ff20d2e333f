"""Every way in refuses the pairs ``check-pair`` refuses, in the same sentence.

``tandem check-pair``, ``tandem generate``, ``tandem serve`` and the window's
load (the engine service) share one rule, :func:`app.hub.require_compatible`,
so a pair cannot be accepted by one and refused by another, nor refused in
other words.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.cli import main as tandem
from app.services import EngineFailure, EngineService
from tests.conftest import TinyModels
from tests.fakes import _free_port


def _foreign(tiny: TinyModels, small_draft: Path, tmp: Path) -> Path:
    return tiny.foreign


def _edited(file: str, **changes: object) -> Callable[[TinyModels, Path, Path], Path]:
    def make(tiny: TinyModels, small_draft: Path, tmp: Path) -> Path:
        folder = Path(shutil.copytree(small_draft, tmp / f"small-{file.split('.')[0]}"))
        data = json.loads((folder / file).read_text())
        for key, value in changes.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        (folder / file).write_text(json.dumps(data))
        return folder

    return make


# (draft maker, the refusal's reasons after "DRAFT cannot draft for tiny-llama: ")
PAIRS = {
    # Another tokenizer: several checks fail, and all are named, in check order.
    "another-tokenizer": (_foreign, "vocabulary sizes differ (384 vs 320); "),
    # The loader never looked at templates or padding; check-pair does.
    "no-chat-template": (
        _edited("tokenizer_config.json", chat_template=None),
        "the draft has no chat template",
    ),
    "other-padding": (
        _edited("tokenizer_config.json", pad_token="<|im_start|>"),
        "padding tokens differ ('<|endoftext|>' vs '<|im_start|>')",
    ),
}


@pytest.fixture(params=sorted(PAIRS))
def refused(request, tiny: TinyModels, small_draft: Path, tmp_path: Path) -> tuple[Path, str]:
    """A draft the tiny target refuses, and check-pair's sentence for it."""
    make, reasons = PAIRS[request.param]
    return make(tiny, small_draft, tmp_path), reasons


def _check_pair_sentence(tiny: TinyModels, draft: Path, capfd: pytest.CaptureFixture[str]) -> str:
    capfd.readouterr()
    assert tandem(["check-pair", str(tiny.target), str(draft)]) == 2
    out, err = capfd.readouterr()
    assert err == ""
    head = out.splitlines()[0]
    assert head.startswith("incompatible: ")
    return head.removeprefix("incompatible: ")


def test_check_pair_names_the_pair_and_every_reason(
    tiny: TinyModels, refused: tuple[Path, str], capfd: pytest.CaptureFixture[str]
) -> None:
    draft, reasons = refused
    sentence = _check_pair_sentence(tiny, draft, capfd)
    assert sentence.startswith(f"{draft.name} cannot draft for tiny-llama: {reasons}")


def test_generate_refuses_in_check_pairs_words(
    tiny: TinyModels, refused: tuple[Path, str], capfd: pytest.CaptureFixture[str]
) -> None:
    draft, _ = refused
    sentence = _check_pair_sentence(tiny, draft, capfd)

    code = tandem(["generate", "--model", str(tiny.target), "--draft", str(draft), "Hi"])

    out, err = capfd.readouterr()
    assert (code, out, err) == (2, "", f"tandem: {sentence}\n")


def test_bench_refuses_in_check_pairs_words(
    tiny: TinyModels, refused: tuple[Path, str], capfd: pytest.CaptureFixture[str]
) -> None:
    draft, _ = refused
    sentence = _check_pair_sentence(tiny, draft, capfd)

    code = tandem(["bench", "--model", str(tiny.target), "--draft", str(draft)])

    out, err = capfd.readouterr()
    assert (code, out, err) == (2, "", f"tandem: {sentence}\n")


def test_the_windows_load_refuses_in_check_pairs_words(
    qtbot: QtBot,
    tiny: TinyModels,
    small_draft: Path,
    refused: tuple[Path, str],
    capfd: pytest.CaptureFixture[str],
) -> None:
    draft, _ = refused
    sentence = _check_pair_sentence(tiny, draft, capfd)
    service = EngineService()
    try:
        with qtbot.waitSignal(service.pair_loaded, timeout=20_000):
            service.load_pair(str(tiny.target), str(small_draft))
        with qtbot.waitSignal(service.failed, timeout=20_000) as failed:
            service.load_pair(str(tiny.target), str(draft))
        # The good pair stays loaded.
        with qtbot.waitSignal(service.pair_loaded, timeout=20_000):
            service.load_pair(str(tiny.target), str(small_draft))
    finally:
        assert service.shutdown()

    failure: EngineFailure = failed.args[0]
    assert (failure.stage, failure.message) == ("load", sentence)


def test_serve_refuses_to_start_in_check_pairs_words(
    tiny: TinyModels, refused: tuple[Path, str], capfd: pytest.CaptureFixture[str]
) -> None:
    draft, _ = refused
    sentence = _check_pair_sentence(tiny, draft, capfd)
    args = ["--model", str(tiny.target), "--draft", str(draft), "--port", str(_free_port())]

    r = subprocess.run(
        [sys.executable, "-m", "app", "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"tandem: {sentence}\n")


def test_a_draft_as_large_as_the_target_runs_everywhere(
    tiny: TinyModels, capfd: pytest.CaptureFixture[str]
) -> None:
    # Size is only a warning in check-pair, so generate runs such a pair too.
    assert tandem(["check-pair", str(tiny.target), str(tiny.copy)]) == 0
    out, _ = capfd.readouterr()
    assert out.startswith("compatible (warning: the draft is 100% of the target")

    pair = ["--model", str(tiny.target), "--draft", str(tiny.copy)]
    code = tandem(["generate", *pair, "--json", "--max-tokens", "4", "Hi"])

    out, _ = capfd.readouterr()
    assert code == 0
    assert json.loads(out)["draft"] == str(tiny.copy)
