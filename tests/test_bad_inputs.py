"""Every entry of the broken-model corpus (tests/corpus.py) through every path a user takes.

The library, the loader, the CLI, the engine service and the importers must each
answer a broken model with one line that says why, never with a traceback, a
hang or a half-written folder.
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pytestqt.qtbot import QtBot

from app.cli import main as tandem
from app.engine import GenerationParams, Message
from app.engine.loader import load_model
from app.errors import IncompatiblePairError, ModelError
from app.hub import inspect_model, load_checked_pair, scan_library
from app.hub.gguf_import import import_folder, import_gguf
from app.services import EngineFailure, EngineService, GenerationResult, PairInfo
from tests.conftest import TinyModels
from tests.corpus import FOLDERS, GGUFS, Entry, GgufEntry, Sources
from tests.fakes import _tandem_in

BROKEN = [e for e in FOLDERS if e.broken]
PAIRS = [e for e in FOLDERS if e.pair]


@dataclass(frozen=True)
class Corpus:
    home: Path  # XDG_DATA_HOME of `tandem models list`
    models: Path  # Tandem's models folder there, holding every folder entry
    paths: dict[str, Path]
    ggufs: dict[str, Path]
    target: Path  # the good target the pair entries are checked against
    locked: tuple[Path, ...]  # folders chmod 000 made unreadable
    chmod_works: bool  # False for root, whom chmod 000 does not stop


@pytest.fixture(scope="module")
def corpus(
    tiny: TinyModels, small_draft: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Corpus]:
    home = tmp_path_factory.mktemp("corpus")
    models = home / "data" / "Tandem" / "models"
    models.mkdir(parents=True)
    sources = Sources(tiny.target, small_draft, tiny.foreign)
    paths = {e.id: e.make(models / e.id, sources) for e in FOLDERS}
    ggufs_dir = home / "gguf"
    ggufs_dir.mkdir()
    ggufs = {g.id: g.make(ggufs_dir / f"{g.id}.gguf", tiny.target) for g in GGUFS}
    locked = tuple(p for p in models.iterdir() if stat.S_IMODE(p.lstat().st_mode) == 0)
    assert locked
    chmod_works = not os.access(locked[0], os.R_OK)
    yield Corpus(home, models, paths, ggufs, tiny.target, locked, chmod_works)
    for folder in locked:
        folder.chmod(0o755)  # so the temporary folder can be removed


@pytest.fixture
def deny(corpus: Corpus, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unreadable folders, unreadable even for root, whom chmod 000 does not stop."""
    if not corpus.chmod_works:
        for folder in corpus.locked:
            _deny(monkeypatch, folder)


def _deny(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Fails what chmod 000 fails: listing ``folder`` and reaching anything in it."""
    inside = str(folder) + os.sep

    def guard(call: Callable[..., Any], *, listing: bool = False) -> Callable[..., Any]:
        def guarded(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
            if not isinstance(path, int):
                full = os.path.abspath(os.fsdecode(path))
                if full.startswith(inside) or (listing and full == str(folder)):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), full)
            return call(path, *args, **kwargs)

        return guarded

    for name in ("stat", "lstat", "open"):
        monkeypatch.setattr(os, name, guard(getattr(os, name)))
    for name in ("scandir", "listdir"):
        monkeypatch.setattr(os, name, guard(getattr(os, name), listing=True))
    monkeypatch.setattr(io, "open", guard(io.open))
    monkeypatch.setattr(builtins, "open", guard(builtins.open))


def _one_line(text: str) -> None:
    assert text.strip(), "an empty message"
    assert "\n" not in text.strip(), text
    assert "Traceback" not in text, text


def _ids(entries: list[Entry] | tuple[Entry, ...] | tuple[GgufEntry, ...]) -> list[str]:
    return [e.id for e in entries]


# --- 1. the library -----------------------------------------------------------------


@pytest.mark.usefixtures("deny")
@pytest.mark.parametrize("entry", FOLDERS, ids=_ids(FOLDERS))
def test_library_names_the_problem(corpus: Corpus, entry: Entry) -> None:
    path = corpus.paths[entry.id]

    info = inspect_model(path)

    if entry.library is None:
        assert info.problem is None and info.usable
        return
    assert info.problem is not None and not info.usable
    _one_line(info.problem)
    assert info.problem.startswith(f"{path.name}: "), info.problem
    assert entry.library in info.problem


@pytest.mark.usefixtures("deny")
def test_library_scan_of_the_whole_corpus(corpus: Corpus) -> None:
    found = {m.name: m for m in scan_library(corpus.models, corpus.home / "no-hf-cache")}

    # Every folder is listed; what is no folder (a file, a link loop) is not.
    folders = {e.id for e in FOLDERS if (corpus.models / e.id).is_dir()}
    assert set(found) == folders
    for entry in FOLDERS:
        if entry.id in found:
            assert (found[entry.id].problem is None) == (entry.library is None), entry.id


# --- 2. loading ------------------------------------------------------------------------


@pytest.mark.usefixtures("deny")
@pytest.mark.parametrize("entry", FOLDERS, ids=_ids(FOLDERS))
def test_load_gives_one_line(corpus: Corpus, entry: Entry) -> None:
    path = corpus.paths[entry.id]
    if entry.load_error is None:
        assert load_model(path, fuse=False).model is not None
        return
    with pytest.raises(ModelError) as info:
        load_model(path, fuse=False)
    assert type(info.value) is ModelError
    _one_line(str(info.value))
    assert entry.load_error is not None and entry.load_error in str(info.value)


@pytest.mark.parametrize("entry", PAIRS, ids=_ids(PAIRS))
def test_load_pair_refuses_the_draft(corpus: Corpus, entry: Entry) -> None:
    with pytest.raises(IncompatiblePairError) as info:
        load_checked_pair(corpus.target, corpus.paths[entry.id], fuse=False)
    _one_line(str(info.value))
    assert str(info.value).startswith(f"{entry.id} cannot draft for tiny-llama: ")
    assert str(entry.pair) in str(info.value)


# --- 3. the command line ---------------------------------------------------------------


@pytest.mark.usefixtures("deny")
@pytest.mark.parametrize("entry", FOLDERS, ids=_ids(FOLDERS))
def test_check_pair_exit_code_and_one_line(
    corpus: Corpus, entry: Entry, capfd: pytest.CaptureFixture[str]
) -> None:
    code = tandem(["check-pair", str(corpus.target), str(corpus.paths[entry.id])])

    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    if entry.check_error is not None:
        assert code == 1
        _one_line(err)
        assert err.startswith("tandem: ") and entry.check_error in err
        assert out == ""
    elif entry.pair is not None:
        assert code == 2
        assert err == ""
        assert out.startswith("incompatible: ") and entry.pair in out.splitlines()[0]
    else:
        assert (code, err) == (0, ""), out
        assert out.startswith("compatible")


@pytest.mark.usefixtures("deny")
@pytest.mark.parametrize("entry", BROKEN, ids=_ids(BROKEN))
def test_generate_refuses_with_one_line(
    corpus: Corpus, entry: Entry, capfd: pytest.CaptureFixture[str]
) -> None:
    code = tandem(["generate", "--model", str(corpus.paths[entry.id]), "Hi"])

    out, err = capfd.readouterr()
    assert (code, out) == (1, "")
    _one_line(err)
    assert err.startswith("tandem: ") and str(entry.load_error) in err


def test_models_list_json_over_the_corpus(corpus: Corpus) -> None:
    r = _tandem_in(corpus.home, "models", "list", "--json")

    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    listed = {m["name"]: m for m in json.loads(r.stdout)}
    for entry in FOLDERS:
        if not (corpus.models / entry.id).is_dir():
            assert entry.id not in listed
            continue
        problem = listed[entry.id]["problem"]
        if corpus.models / entry.id in corpus.locked and not corpus.chmod_works:
            continue  # root reads it; the in-process tests simulate the denial
        if entry.library is None:
            assert problem is None, entry.id
        else:
            _one_line(problem)
            assert problem.startswith(f"{entry.id}: ") and entry.library in problem


# One entry of each kind through the real executable: the in-process runs above
# cannot see what only a fresh process prints (warnings, errors at exit).
SAMPLE = {
    "invalid-json": 1,
    "folder-is-a-link-loop": 1,
    "unknown-home-folder": 1,
    "wrong-shape": 1,
    "tokenizer-of-no-known-kind": 1,
}
SAMPLED = [e for e in FOLDERS if e.id in SAMPLE]


@pytest.mark.parametrize("entry", SAMPLED, ids=_ids(SAMPLED))
def test_check_pair_process(corpus: Corpus, entry: Entry) -> None:
    code = SAMPLE[entry.id]

    r = _tandem_in(corpus.home, "check-pair", str(corpus.target), str(corpus.paths[entry.id]))

    assert r.returncode == code, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    if code == 1:
        _one_line(r.stderr)
        assert r.stderr.startswith("tandem: ") and str(entry.check_error) in r.stderr
    else:
        assert r.stderr == ""
        assert r.stdout.startswith("incompatible: ")


# --- 4. the engine service ---------------------------------------------------------------

UNKNOWN_HOME = "unknown-home-folder"
ENGINE = [e for e in BROKEN + PAIRS if e.id != UNKNOWN_HOME]  # see the test after this one


@pytest.mark.usefixtures("deny")
def test_engine_refuses_each_and_keeps_the_good_pair(
    qtbot: QtBot, corpus: Corpus, small_draft: Path
) -> None:
    service = EngineService()
    try:
        with qtbot.waitSignal(service.pair_loaded, timeout=20_000) as loaded:
            service.load_pair(str(corpus.target), str(small_draft))
        assert isinstance(loaded.args[0], PairInfo)
        failures: dict[str, EngineFailure] = {}
        for entry in ENGINE:
            path = str(corpus.paths[entry.id])
            with qtbot.waitSignal(service.failed, timeout=10_000) as failed:
                if entry.broken:
                    service.load_pair(path)
                else:
                    service.load_pair(str(corpus.target), path)
            failures[entry.id] = failed.args[0]
        with qtbot.waitSignal(service.generation_finished, timeout=20_000) as finished:
            service.generate([Message("user", "Hello")], GenerationParams(max_tokens=8))
    finally:
        assert service.shutdown()

    for entry in ENGINE:
        failure = failures[entry.id]
        assert failure.stage == "load", entry.id
        _one_line(failure.message)
        assert str(entry.load_error or entry.pair) in failure.message, entry.id
    result: GenerationResult = finished.args[0]
    assert result.pair.label == f"tiny-llama + {small_draft.name}"
    assert result.finished.token_ids


def test_engine_refuses_a_folder_in_an_unknown_home(qtbot: QtBot, corpus: Corpus) -> None:
    service = EngineService()
    try:
        with qtbot.waitSignal(service.failed, timeout=3_000) as failed:
            service.load_pair(str(corpus.paths[UNKNOWN_HOME]))
    finally:
        assert service.shutdown()
    assert failed.args[0].stage == "load"
    assert "no such folder" in failed.args[0].message


# --- 5. importing ------------------------------------------------------------------------


def _leftovers(out: Path) -> list[Path]:
    return [out] * out.exists() + sorted(out.parent.glob(f".{out.name}.*"))


@pytest.mark.parametrize("entry", GGUFS, ids=_ids(GGUFS))
def test_gguf_import_refuses_and_leaves_nothing(
    corpus: Corpus, entry: GgufEntry, tmp_path: Path
) -> None:
    out = tmp_path / "models" / entry.id

    with pytest.raises(ModelError) as info:
        import_gguf(corpus.ggufs[entry.id], out)

    _one_line(str(info.value))
    assert entry.error in str(info.value)
    assert str(info.value).count(".gguf:") == 1  # said once, not wrapped in a second reason
    assert _leftovers(out) == []


@pytest.mark.usefixtures("deny")
@pytest.mark.parametrize("entry", FOLDERS, ids=_ids(FOLDERS))
def test_folder_import_refuses_and_leaves_nothing(
    corpus: Corpus, entry: Entry, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    path = corpus.paths[entry.id]
    # Only what loading checks without loading is refused; the rest fails on load.
    refused = entry.load_error is not None and entry.library is not None
    if not refused:
        imported = import_folder(path, models)
        assert imported == models / entry.id
        assert (imported / "config.json").is_file()
        assert not any(p.is_symlink() for p in imported.iterdir())
        return
    with pytest.raises(ModelError) as info:
        import_folder(path, models)
    _one_line(str(info.value))
    assert entry.load_error is not None and entry.load_error in str(info.value)
    assert not models.exists() or list(models.iterdir()) == []
