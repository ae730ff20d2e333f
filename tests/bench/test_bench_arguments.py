"""`tandem bench` refuses bad arguments and files it must not write in one line, before it runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import TinyModels
from tests.fakes import _tandem_here

# Each is refused before a model loads or a measurement runs.
SYNTHETIC = ("--synthetic", "tiny:tiny", "--ks", "0", "--max-tokens", "2", "--cold")


def _one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--context", "-5"), "tandem: --context must be 1 or more, not -5"),
        (("--max-tokens", "0"), "tandem: --max-tokens must be 1 or more, not 0"),
        (("--repeats", "-1"), "tandem: --repeats must be 1 or more, not -1"),
    ],
)
def test_a_bad_number_is_one_line_and_exit_2(args: tuple[str, ...], said: str) -> None:
    r = _tandem_here("bench", *SYNTHETIC, *args)
    assert r.returncode == 2
    assert _one_line(r.stderr) == said


def test_prompts_naming_a_missing_file_is_one_line_and_exit_2(
    tiny: TinyModels, tmp_path: Path
) -> None:
    missing = tmp_path / "missing.txt"
    r = _tandem_here("bench", "--model", str(tiny.target), "--prompts", str(missing))
    assert r.returncode == 2
    assert _one_line(r.stderr) == (
        f"tandem: --prompts: cannot read {missing} (No such file or directory)"
    )


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["folder", "fifo", "not a list", "empty"])
def test_prompts_that_hold_no_prompts_are_one_line_and_exit_2(
    tiny: TinyModels, tmp_path: Path, kind: str
) -> None:
    prompts = tmp_path / "prompts"
    if kind == "folder":
        prompts.mkdir()
    elif kind == "fifo":
        os.mkfifo(prompts)  # a read would wait for a writer forever
    else:
        prompts.write_text('{"prompt": "Hi"}' if kind == "not a list" else "\n\n")
    r = _tandem_here("bench", "--model", str(tiny.target), "--prompts", str(prompts))
    assert r.returncode == 2
    assert _one_line(r.stderr).startswith(f"tandem: --prompts: {prompts} ")


def _link_to_a_file(path: Path) -> Path:
    kept = path.with_name("kept.json")
    kept.write_text("kept")
    path.symlink_to(kept)
    return kept


@pytest.mark.parametrize("kind", ["symlink", "folder", "fifo"])
def test_json_naming_a_link_a_folder_or_no_regular_file_is_refused_and_left_alone(
    tmp_path: Path, kind: str
) -> None:
    # A FIFO stands for a device: a real one (/dev/full) must never be put at risk here.
    path = tmp_path / "out.json"
    kept = None
    if kind == "symlink":
        kept = _link_to_a_file(path)
    elif kind == "folder":
        path.mkdir()
    else:
        os.mkfifo(path)
    r = _tandem_here("bench", *SYNTHETIC, "--json", str(path))
    assert r.returncode == 1
    line = _one_line(r.stderr)
    assert line.startswith(f"tandem: --json: {path} ")
    if kind == "symlink":
        assert kept is not None and path.is_symlink() and kept.read_text() == "kept"
    elif kind == "folder":
        assert path.is_dir()
    else:
        assert path.is_fifo()


def test_json_is_still_written_as_a_new_or_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    path.write_text("old")
    r = _tandem_here("bench", *SYNTHETIC, "--json", str(path))
    assert r.returncode == 0, r.stderr
    assert path.is_file() and path.read_text().startswith("{")
