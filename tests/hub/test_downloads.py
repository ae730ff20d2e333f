"""Hub search and downloads against a fake Hub served from 127.0.0.1.

The fake answers the few routes huggingface_hub uses (``/api/models``,
``/api/models/<repo>[/revision/<rev>]`` and ``/<repo>/resolve/<rev>/<file>``) the
way the real Hub does, headers and error codes included, so the real
``HfApi`` and ``hf_hub_download`` run end to end without leaving the machine.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from huggingface_hub import constants, file_download

from app.engine.loader import read_config
from app.errors import ModelError
from app.hub.downloads import (
    DownloadCancelled,
    DownloadProgress,
    RepoInfo,
    discard_download,
    download_model,
    model_folder_name,
    search_models,
)
from app.testing.tiny import build_model, model_config

REPO = "mlx-community/Tiny-Llama-4bit"
TOKEN = "hf_FakeTokenForTestsOnly0123456789"
SHA = "0123456789abcdef0123456789abcdef01234567"
# Files an MLX model folder does not need; none of them may be fetched.
UNWANTED = {
    "README.md": b"# Tiny\n",
    "modeling_tiny.py": b"raise SystemExit\n",
    "pytorch_model.bin": b"\0" * 64,
    "consolidated.safetensors": b"\0" * 64,
    "original/tokenizer.model": b"\0" * 16,
    ".gitattributes": b"*.safetensors filter=lfs\n",
}
EXTRA_WANTED = {"chat_template.jinja": b"{{ messages }}", "merges.txt": b"#version: 0.2\n"}
# The fake Hub stops itself after this long, whatever happens to the test.
SERVER_LIFETIME_S = 60.0


@dataclass
class Repo:
    files: dict[str, bytes]
    gated: bool = False
    sha: str = SHA


@dataclass
class Seen:
    method: str
    path: str
    authorization: str | None


@dataclass
class FakeHub:
    url: str
    repos: dict[str, Repo]
    search_results: list[dict[str, Any]] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fetched(self) -> list[str]:
        """Files whose bytes were sent (GET on /resolve), in order."""
        with self.lock:
            return [
                s.path.split("/resolve/", 1)[1].split("/", 1)[1]
                for s in self.seen
                if s.method == "GET" and "/resolve/" in s.path
            ]

    def authorizations(self) -> set[str | None]:
        with self.lock:
            return {s.authorization for s in self.seen}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self._answer(head=False)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep pytest's output clean

    def _answer(self, *, head: bool) -> None:
        hub = self.server.hub
        url = urlsplit(self.path)
        path = unquote(url.path)
        with hub.lock:
            hub.seen.append(Seen(self.command, path, self.headers.get("Authorization")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) == 2:
            self._search(parse_qs(url.query), head)
        elif parts[:2] == ["api", "models"] and len(parts) >= 4:
            self._model_info("/".join(parts[2:4]), parts[4:], head)
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]), head)
        else:
            self._send(404, head=head)

    def _search(self, query: dict[str, list[str]], head: bool) -> None:
        hub = self.server.hub
        words = query.get("search", [""])[0].lower()
        author = query.get("author", [""])[0]
        limit = int(query.get("limit", ["1000"])[0])
        found = [
            m
            for m in hub.search_results
            if words in m["id"].lower() and (not author or m["id"].startswith(author + "/"))
        ]
        self._send_json(found[:limit], head)

    def _model_info(self, repo_id: str, rest: list[str], head: bool) -> None:
        repo = self.server.hub.repos.get(repo_id)
        if repo is None:
            self._send(404, head=head, headers={"X-Error-Code": "RepoNotFound"})
            return
        if rest and (rest[0] != "revision" or rest[1] not in ("main", repo.sha)):
            self._send(404, head=head, headers={"X-Error-Code": "RevisionNotFound"})
            return
        info = {
            "id": repo_id,
            "sha": repo.sha,
            "private": False,
            "gated": "manual" if repo.gated else False,
            "siblings": [
                {"rfilename": name, "size": len(data), "blobId": _etag(data)}
                for name, data in sorted(repo.files.items())
            ],
        }
        self._send_json(info, head)

    def _resolve(self, repo_id: str, revision: str, filename: str, head: bool) -> None:
        repo = self.server.hub.repos.get(repo_id)
        if repo is None:
            self._send(404, head=head, headers={"X-Error-Code": "RepoNotFound"})
            return
        if repo.gated and self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._send(403, head=head, headers={"X-Error-Code": "GatedRepo"})
            return
        if revision not in ("main", repo.sha) or filename not in repo.files:
            self._send(404, head=head, headers={"X-Error-Code": "EntryNotFound"})
            return
        data = repo.files[filename]
        headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{_etag(data)}"'}
        self._send(200, data, head=head, headers=headers)

    def _send_json(self, value: Any, head: bool) -> None:
        body = json.dumps(value).encode()
        self._send(200, body, head=head, headers={"Content-Type": "application/json"})

    def _send(
        self, status: int, body: bytes = b"", *, head: bool, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    hub: FakeHub


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _point_hub_at(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """Sends huggingface_hub to ``url``; its constants are read once, at import."""
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the test suite sets it


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The files of a tiny llama model as the Hub would hold them, plus files to skip."""
    folder = build_model(tmp_path_factory.mktemp("hub") / "tiny", model_config("llama"))
    files = {f.name: f.read_bytes() for f in folder.iterdir()}
    return {**files, **EXTRA_WANTED, **UNWANTED}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tiny_repo: dict[str, bytes]) -> Iterator[FakeHub]:
    server = _Server(("127.0.0.1", 0), _Handler)
    fake = FakeHub(
        url=f"http://127.0.0.1:{server.server_address[1]}",
        repos={REPO: Repo(dict(tiny_repo))},
    )
    server.hub = fake
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    watchdog = threading.Timer(SERVER_LIFETIME_S, server.shutdown)
    watchdog.daemon = True
    watchdog.start()
    _point_hub_at(monkeypatch, fake.url)
    try:
        yield fake
    finally:
        watchdog.cancel()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    return tmp_path / "models"


def wanted_files(repo: dict[str, bytes]) -> set[str]:
    return {name for name in repo if name not in UNWANTED}


def leftovers(models_dir: Path) -> list[Path]:
    """Temporary files hf_hub_download writes while a file is in flight."""
    return [p for p in models_dir.rglob("*") if p.name.endswith(".incomplete")]


def staging_of(models_dir: Path, repo_id: str = REPO) -> Path:
    return models_dir / f".{model_folder_name(repo_id)}.download"


def collect() -> tuple[list[DownloadProgress], Callable[[DownloadProgress], None]]:
    events: list[DownloadProgress] = []
    return events, events.append


# --- downloads ------------------------------------------------------------------


def test_download_fetches_only_what_mlx_needs(hub: FakeHub, models_dir: Path) -> None:
    folder = download_model(REPO, models_dir)

    assert folder == models_dir / "mlx-community--Tiny-Llama-4bit"
    assert read_config(folder)["model_type"] == "llama"
    repo = hub.repos[REPO].files
    assert {p.name for p in folder.iterdir()} == wanted_files(repo)
    for name in wanted_files(repo):
        assert (folder / name).read_bytes() == repo[name]
    assert sorted(hub.fetched()) == sorted(wanted_files(repo))
    # The staging folder was renamed into place; hf_hub_download's bookkeeping is gone.
    assert not staging_of(models_dir).exists()
    assert not (folder / ".cache").exists()
    assert not leftovers(models_dir)


def test_progress_adds_up_and_ends_at_total(hub: FakeHub, models_dir: Path) -> None:
    events, report = collect()
    threads: set[str] = set()

    def progress(p: DownloadProgress) -> None:
        threads.add(threading.current_thread().name)
        report(p)

    download_model(REPO, models_dir, progress=progress)

    repo = hub.repos[REPO].files
    sizes = {name: len(repo[name]) for name in wanted_files(repo)}
    total = sum(sizes.values())
    assert {e.total for e in events} == {total}
    assert all(e.repo_id == REPO for e in events)
    assert events[0] == DownloadProgress(REPO, None, 0, 0, 0, total)
    assert events[-1] == DownloadProgress(REPO, None, 0, 0, total, total)
    dones = [e.done for e in events]
    assert dones == sorted(dones)
    assert all(0 <= e.file_done <= e.file_total for e in events)
    for name, size in sizes.items():
        mine = [e for e in events if e.file == name]
        assert mine[0].file_done == 0 and mine[-1].file_done == size
        assert {e.file_total for e in mine} == {size}
        # Within a file, done is the bytes before it plus the file's own bytes.
        assert len({e.done - e.file_done for e in mine}) == 1
    # Bytes were reported as they arrived, not only at file boundaries.
    weights = [e for e in events if e.file == "model.safetensors"]
    assert len(weights) >= 3
    assert config_first(events)
    assert threads == {threading.current_thread().name}  # the caller's thread only


def config_first(events: list[DownloadProgress]) -> bool:
    files = [e.file for e in events if e.file is not None]
    return files[0] == "config.json" and files[-1] == "model.safetensors"


def test_cancel_after_the_first_file_then_resume(hub: FakeHub, models_dir: Path) -> None:
    cancel = threading.Event()
    started: list[str] = []

    def progress(p: DownloadProgress) -> None:
        if p.file is not None and p.file not in started:
            started.append(p.file)
        if len(started) == 2:
            cancel.set()  # as the second file starts

    with pytest.raises(DownloadCancelled):
        download_model(REPO, models_dir, progress=progress, cancel=cancel)

    staging = staging_of(models_dir)
    assert started[0] == "config.json"
    assert hub.fetched()[0] == "config.json" and len(hub.fetched()) <= 2
    assert not (models_dir / model_folder_name(REPO)).exists()
    assert (staging / "config.json").is_file()  # kept for the next call
    assert not (staging / started[1]).exists()
    assert not leftovers(models_dir)

    events, report = collect()
    folder = download_model(REPO, models_dir, progress=report)

    read_config(folder)
    assert hub.fetched().count("config.json") == 1  # resumed, not fetched again
    assert set(hub.fetched()) == wanted_files(hub.repos[REPO].files)
    assert events[-1].done == events[-1].total


def test_cancel_during_a_file_keeps_no_partial_file(
    hub: FakeHub, models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)  # many chunks per file
    cancel = threading.Event()

    def progress(p: DownloadProgress) -> None:
        if p.file == "model.safetensors" and p.file_done > 0:
            cancel.set()

    with pytest.raises(DownloadCancelled):
        download_model(REPO, models_dir, progress=progress, cancel=cancel)

    staging = staging_of(models_dir)
    assert "model.safetensors" in hub.fetched()
    assert not (staging / "model.safetensors").exists()
    assert not leftovers(models_dir)
    assert (staging / "tokenizer.json").is_file()

    folder = download_model(REPO, models_dir)
    assert (folder / "model.safetensors").read_bytes() == hub.repos[REPO].files["model.safetensors"]


def test_resume_at_a_newer_revision_drops_stale_files(hub: FakeHub, models_dir: Path) -> None:
    cancel = threading.Event()
    with pytest.raises(DownloadCancelled):
        download_model(REPO, models_dir, progress=lambda _p: cancel.set(), cancel=cancel)
    staging = staging_of(models_dir)
    # A shard the old revision had and the new one has not.
    (staging / "model-00002-of-00002.safetensors").write_bytes(b"old")
    (staging / "config.json").write_bytes(hub.repos[REPO].files["config.json"])
    hub.repos[REPO].sha = "f" * 40

    folder = download_model(REPO, models_dir)

    assert not (folder / "model-00002-of-00002.safetensors").exists()
    assert {p.name for p in folder.iterdir()} == wanted_files(hub.repos[REPO].files)
    read_config(folder)


def test_one_download_per_repo_at_a_time(hub: FakeHub, models_dir: Path) -> None:
    entered, release = threading.Event(), threading.Event()
    result: dict[str, Path] = {}

    def progress(p: DownloadProgress) -> None:
        entered.set()
        release.wait(5)

    def first() -> None:
        result["folder"] = download_model(REPO, models_dir, progress=progress)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert entered.wait(5)
        with pytest.raises(ModelError, match="is already being downloaded"):
            download_model(REPO, models_dir)
        with pytest.raises(ModelError, match="is already being downloaded"):
            discard_download(REPO, models_dir)
    finally:
        release.set()
        thread.join(10)
    read_config(result["folder"])


def test_discard_download_deletes_the_leftovers(hub: FakeHub, models_dir: Path) -> None:
    cancel = threading.Event()
    with pytest.raises(DownloadCancelled):
        download_model(REPO, models_dir, progress=lambda _p: cancel.set(), cancel=cancel)
    assert staging_of(models_dir).is_dir()

    assert discard_download(REPO, models_dir) >= 0
    assert not staging_of(models_dir).exists()
    assert discard_download(REPO, models_dir) == 0


def test_an_existing_folder_is_not_overwritten(hub: FakeHub, models_dir: Path) -> None:
    (models_dir / model_folder_name(REPO)).mkdir(parents=True)
    with pytest.raises(ModelError, match="already exists"):
        download_model(REPO, models_dir)
    assert hub.fetched() == []


def test_a_repo_without_mlx_weights_is_refused_before_fetching(
    hub: FakeHub, models_dir: Path
) -> None:
    hub.repos["someone/torch-only"] = Repo({"config.json": b"{}", "pytorch_model.bin": b"0"})
    with pytest.raises(ModelError, match=r"^someone/torch-only has no \.safetensors weights"):
        download_model("someone/torch-only", models_dir)
    assert hub.fetched() == []


def test_an_unsupported_architecture_stops_before_the_weights(
    hub: FakeHub, models_dir: Path
) -> None:
    files = dict(hub.repos[REPO].files)
    files["config.json"] = json.dumps({"model_type": "no_such_architecture"}).encode()
    hub.repos["someone/odd"] = Repo(files)
    with pytest.raises(ModelError, match="architecture 'no_such_architecture' is not supported"):
        download_model("someone/odd", models_dir)
    assert "model.safetensors" not in hub.fetched()


def test_an_invalid_repo_id_is_refused(models_dir: Path) -> None:
    with pytest.raises(ModelError, match="not a Hugging Face repo id"):
        download_model("../../etc", models_dir)
    assert not models_dir.exists()


# --- errors ---------------------------------------------------------------------


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text
    return text


def assert_nothing_installed(models_dir: Path, repo_id: str = REPO) -> None:
    assert not (models_dir / model_folder_name(repo_id)).exists()
    assert not (staging_of(models_dir, repo_id) / "model.safetensors").exists()
    assert not leftovers(models_dir)


def test_gated_repo_asks_for_license_and_token(hub: FakeHub, models_dir: Path) -> None:
    hub.repos[REPO].gated = True
    with pytest.raises(ModelError) as caught:
        download_model(REPO, models_dir)
    assert one_line(caught.value) == (
        f"{REPO} is gated: accept its license on huggingface.co and add a token"
    )
    assert_nothing_installed(models_dir)

    folder = download_model(REPO, models_dir, token=TOKEN)  # the license was accepted
    read_config(folder)


def test_missing_repo(hub: FakeHub, models_dir: Path) -> None:
    with pytest.raises(ModelError) as caught:
        download_model("mlx-community/No-Such-Model", models_dir)
    assert one_line(caught.value) == "mlx-community/No-Such-Model does not exist or is private"
    assert_nothing_installed(models_dir, "mlx-community/No-Such-Model")


def test_missing_revision(hub: FakeHub, models_dir: Path) -> None:
    with pytest.raises(ModelError) as caught:
        download_model(REPO, models_dir, revision="v9")
    assert one_line(caught.value) == f"{REPO} has no revision 'v9'"


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there now: connections are refused


@pytest.mark.parametrize("how", ["offline-mode", "connection-refused", "lost-after-listing"])
def test_no_network(
    hub: FakeHub, models_dir: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    progress: Callable[[DownloadProgress], None] | None = None
    if how == "offline-mode":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    elif how == "connection-refused":
        _point_hub_at(monkeypatch, closed_port_url())
    else:

        def progress(p: DownloadProgress) -> None:
            constants.HF_HUB_OFFLINE = True  # restored by monkeypatch at teardown

    with pytest.raises(ModelError) as caught:
        download_model(REPO, models_dir, progress=progress)
    assert one_line(caught.value) == "no network: cannot reach the Hugging Face Hub"
    assert_nothing_installed(models_dir)


def test_disk_full_while_writing(
    hub: FakeHub, models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_http_get = file_download.http_get

    def full_disk(url: str, temp_file: Any, **kwargs: Any) -> None:
        if url.endswith("/model.safetensors"):
            temp_file.write(b"half a tensor")
            temp_file.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        real_http_get(url, temp_file, **kwargs)

    monkeypatch.setattr(file_download, "http_get", full_disk)
    with pytest.raises(ModelError) as caught:
        download_model(REPO, models_dir)
    assert one_line(caught.value).startswith(f"not enough disk space to download {REPO}")
    assert_nothing_installed(models_dir)
    assert (staging_of(models_dir) / "config.json").is_file()  # finished files stay


def test_too_little_free_space_is_refused_up_front(
    hub: FakeHub, models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    real = shutil.disk_usage

    def tiny_disk(path: Any) -> Any:
        usage = real(path)
        return type(usage)(usage.total, usage.total - 1000, 1000)

    monkeypatch.setattr(shutil, "disk_usage", tiny_disk)
    with pytest.raises(ModelError) as caught:
        download_model(REPO, models_dir)
    assert one_line(caught.value).startswith(f"not enough disk space for {REPO}: ")
    assert hub.fetched() == []
    assert_nothing_installed(models_dir)


# --- search ---------------------------------------------------------------------


def test_search_returns_repo_infos(hub: FakeHub) -> None:
    hub.search_results = [
        {"id": "mlx-community/Qwen3-4B-4bit", "downloads": 900, "likes": 12, "tags": ["mlx"]},
        {"id": "mlx-community/Llama-3.2-1B-4bit", "downloads": 500, "likes": 3, "gated": "manual"},
        {"id": "someone-else/Qwen3-4B", "downloads": 10, "likes": 0, "gated": False, "tags": []},
    ]
    found = search_models("qwen3")
    assert found == [RepoInfo("mlx-community/Qwen3-4B-4bit", 900, 12, False, ("mlx",))]

    found = search_models("", limit=5)
    assert [r.repo_id for r in found] == [
        "mlx-community/Qwen3-4B-4bit",
        "mlx-community/Llama-3.2-1B-4bit",
    ]
    assert found[1].gated is True and found[1].tags == ()

    assert len(search_models("qwen3", author=None)) == 2
    query = [s.path for s in hub.seen if s.path == "/api/models"]
    assert len(query) == 3


def test_search_without_network(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError, match=r"^no network: cannot reach the Hugging Face Hub$"):
        search_models("qwen")


# --- the token --------------------------------------------------------------------


def test_token_is_sent_but_never_shown(
    hub: FakeHub, models_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="huggingface_hub")
    hub.repos[REPO].gated = True
    hub.search_results = [{"id": "mlx-community/Qwen3-4B-4bit"}]

    search_models("qwen", token=TOKEN)
    download_model(REPO, models_dir, token=TOKEN)
    assert hub.authorizations() == {f"Bearer {TOKEN}"}  # every request, none without

    hub.repos["mlx-community/Private"] = Repo(dict(hub.repos[REPO].files), gated=True)
    errors: list[BaseException] = []
    for call in (
        lambda: download_model("mlx-community/Missing", models_dir, token=TOKEN),
        lambda: download_model("mlx-community/Private", models_dir, token=TOKEN + "-wrong"),
        lambda: download_model(REPO, models_dir, token=TOKEN),  # already exists
    ):
        with pytest.raises(ModelError) as caught:
            call()
        errors.append(caught.value)

    for error in errors:
        chain: BaseException | None = error
        while chain is not None:
            assert TOKEN not in str(chain) and TOKEN not in repr(chain)
            chain = chain.__cause__ or chain.__context__
    assert "authenticated: True" in caplog.text  # the Hub's request logs were captured
    assert TOKEN not in caplog.text


def test_no_token_means_none_is_sent(
    hub: FakeHub, models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_FromTheEnvironmentNotToBeSent")
    hub.search_results = [{"id": "mlx-community/Qwen3-4B-4bit"}]
    search_models("qwen")
    download_model(REPO, models_dir)
    assert hub.authorizations() == {None}


def test_search_offline_says_no_network_at_once_without_retrying(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket
    import time

    from huggingface_hub.utils import _http

    with socket.socket() as probe:  # a port nothing listens on: connection refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _point_hub_at(monkeypatch, f"http://127.0.0.1:{port}")
    for name in (
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    waits: list[float] = []
    monkeypatch.setattr(_http.time, "sleep", waits.append)  # huggingface_hub's backoff
    started = time.monotonic()
    with pytest.raises(ModelError, match=r"^no network: cannot reach the Hugging Face Hub$"):
        search_models("qwen")
    assert waits == []  # the first refusal is the answer, not the sixth
    assert time.monotonic() - started < 1.0


def test_an_unknown_hub_host_is_no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    def no_dns(*_args: object, **_kwargs: object) -> socket.socket:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    _point_hub_at(monkeypatch, "https://huggingface.co")
    for name in (
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(socket, "create_connection", no_dns)
    waits: list[float] = []
    from huggingface_hub.utils import _http

    monkeypatch.setattr(_http.time, "sleep", waits.append)
    with pytest.raises(ModelError, match=r"^no network"):
        search_models("qwen")
    assert waits == []
