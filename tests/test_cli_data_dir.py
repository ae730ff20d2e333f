"""`generate` and `bench` with an unusable data folder, or a profile that cannot be stored."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from app.engine import load_pair
from app.engine.costs import K_MAX, CostProfile, ProfileStore, machine
from app.engine.generate import cost_model_for
from tests.conftest import TinyModels
from tests.fakes import _tandem_here


def _full_disk(*_args: object, **_kwargs: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def _all_but_the_plain_width(target: Path, store: ProfileStore | None = None) -> str:
    """Stores a profile that one plain step completes: the next reply stores it again."""
    device, version = machine()
    verify = (None, *[0.001 * (m + 1) for m in range(1, K_MAX + 1)])
    profile = CostProfile(verify=verify, device=device, mlx=version)
    stored_as = str(load_pair(target).target.path)
    (store or ProfileStore()).put(stored_as, None, profile)
    return stored_as


def test_generate_completes_with_one_warning_when_the_profile_cannot_be_stored(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.files

    _all_but_the_plain_width(tiny.target)
    monkeypatch.setattr(app.files, "write_atomic", _full_disk)
    r = _tandem_here(
        "generate", "--model", str(tiny.target), "--num-draft", "0", "--max-tokens", "4", "Hi"
    )
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, r.stderr
    assert warnings[0].startswith("tandem: warning: could not store cost profiles in ")
    assert warnings[0].endswith("(No space left on device)")
    assert "Traceback" not in r.stderr
    assert "tok/s" in r.stderr  # the reply ran to its end


def test_a_cost_model_whose_store_fails_warns_once_and_goes_on(
    tiny_pair, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "profiles.json"
    folder.mkdir()  # a folder where the file goes: every write fails, even as root
    model = cost_model_for(tiny_pair, ProfileStore(folder))
    assert model.on_complete is not None
    with caplog.at_level(logging.WARNING, logger="app"):
        for _ in range(2):
            model.on_complete(model.profile())
    said = [r.getMessage() for r in caplog.records if "cost profiles" in r.getMessage()]
    assert said == [f"could not store cost profiles in {folder} (Is a directory)"]
    assert all(r.exc_info is None for r in caplog.records)  # one line, no traceback


@pytest.mark.parametrize("how", ["--data-dir", "XDG_DATA_HOME"])
@pytest.mark.parametrize("command", ["generate", "bench"])
def test_a_data_folder_that_is_a_file_is_one_line_and_exit_1(
    tiny: TinyModels, tmp_path: Path, how: str, command: str
) -> None:
    file = tmp_path / "a-file"
    file.write_text("not a folder")
    args = ["generate", "--model", str(tiny.target), "--max-tokens", "2", "Hi"]
    if command == "bench":
        args = ["bench", "--model", str(tiny.target), "--max-tokens", "2", "--cold"]
    if how == "--data-dir":
        r = _tandem_here("--data-dir", str(file), *args)
        expected = f"tandem: unusable data folder: {file} is not a folder"
    else:
        r = _tandem_here(*args, env={"XDG_DATA_HOME": str(file)})
        expected = f"tandem: unusable data folder: {file / 'Tandem'}: {file} is not a folder"
    assert r.returncode == 1
    assert r.stderr.splitlines() == [expected]
    assert r.stdout == ""


def test_generate_keeps_its_profiles_in_the_data_folder_given(
    tiny: TinyModels, tmp_path: Path
) -> None:
    store = ProfileStore(tmp_path / "data" / "profiles.json")
    stored_as = _all_but_the_plain_width(tiny.target, store)
    r = _tandem_here(
        "--data-dir",
        str(tmp_path / "data"),
        "generate",
        "--model",
        str(tiny.target),
        "--num-draft",
        "0",
        "--max-tokens",
        "4",
        "Hi",
    )
    assert r.returncode == 0, r.stderr
    profile = store.get(stored_as, None)
    assert profile is not None and profile.verify[0] is not None  # measured, stored there


def test_bench_completes_with_one_warning_when_the_profile_cannot_be_stored(
    tiny: TinyModels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.files

    _all_but_the_plain_width(tiny.target)  # the turn-two timing's plain steps complete it
    monkeypatch.setattr(app.files, "write_atomic", _full_disk)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Say hello.\n")
    r = _tandem_here(
        "bench",
        "--model",
        str(tiny.target),
        "--ks",
        "0",
        "--impls",
        "tandem",
        "--prompts",
        str(prompts),
        "--max-tokens",
        "4",
        "--cold",
        "--ttft",
    )
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if "warning" in line]
    assert warnings == [
        f"tandem: warning: could not store cost profiles in "
        f"{ProfileStore().path} (No space left on device)"
    ]
    assert "Traceback" not in r.stderr
    assert "turn 2" in r.stdout  # the bench ran to its end
