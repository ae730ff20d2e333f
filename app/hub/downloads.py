"""Searching the Hugging Face Hub and downloading MLX models into Tandem's model folder.

:func:`download_model` lists a repo's files with their sizes, keeps the ones an
MLX model needs and fetches them one at a time with ``hf_hub_download`` into a
hidden staging folder next to the final one (``.<org>--<name>.download``). Once
every file has arrived and the folder passes :func:`read_config`, it is renamed
into place, so the library never shows a half-downloaded model.

A cancelled or failed download keeps the files that finished, and the next call
for the same repo continues from there. This version of ``huggingface_hub``
deletes the temporary file of the file in flight when it stops, so that one file
starts over.
"""

from __future__ import annotations

import errno
import functools
import importlib
import json
import os
import queue
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from app.engine.loader import read_config
from app.errors import ModelError
from app.hub.library import require_space
from app.keychain import scrub

if TYPE_CHECKING:
    from huggingface_hub.hf_api import ExpandModelProperty_T

# What mlx-lm fetches for a model (its DEFAULT_ALLOW_PATTERNS) except code: no *.py.
_WANTED_SUFFIXES = (".json", ".jsonl", ".safetensors", ".tiktoken", ".txt", ".jinja")
_WANTED_NAMES = frozenset({"tokenizer.model", "tiktoken.model"})
_TOKENIZERS = ("tokenizer.json", "tokenizer.model")
_STAGING_SUFFIX = ".download"
# Where hf_hub_download keeps its per-file metadata and temporary files in a local_dir.
_HF_STATE = Path(".cache") / "huggingface"
# Anything shaped like a Hugging Face token, hidden from messages as a last resort.
_EXPAND: list[ExpandModelProperty_T] = ["downloads", "likes", "gated", "tags"]
# Disk full, or over quota.
_NO_SPACE = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})

# Model folders being downloaded by this process; a second download of one would race.
_active: set[str] = set()
_active_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class DownloadProgress:
    """How far a download has come.

    Attributes:
        repo_id: ``org/name`` of the repo being downloaded.
        file: The file in flight; ``None`` for the first event (after the listing)
            and the last one (after the folder is in place).
        file_done: Bytes of ``file`` received.
        file_total: Size of ``file`` in bytes.
        done: Bytes of the whole download received, files kept from an earlier
            attempt included.
        total: Bytes of all the files the download fetches.
    """

    repo_id: str
    file: str | None
    file_done: int
    file_total: int
    done: int
    total: int


@dataclass(frozen=True, slots=True)
class RepoInfo:
    """One search result.

    Attributes:
        repo_id: ``org/name`` on the Hub.
        downloads: Downloads over the last 30 days.
        likes: Likes on the Hub.
        gated: Whether the license must be accepted on huggingface.co first.
        tags: The repo's tags.
    """

    repo_id: str
    downloads: int
    likes: int
    gated: bool
    tags: tuple[str, ...]


class DownloadCancelled(Exception):  # noqa: N818 - a cancel, not an error
    """The download was cancelled; finished files are kept so a later call resumes."""


@dataclass(frozen=True, slots=True)
class _RemoteFile:
    name: str
    size: int


def model_folder_name(repo_id: str) -> str:
    """The folder a repo is downloaded into: ``org/name`` becomes ``org--name``.

    The organisation stays in the name so that two orgs' models of the same name
    never share a folder.
    """
    return repo_id.replace("/", "--")


def search_models(
    query: str,
    *,
    author: str | None = "mlx-community",
    limit: int = 20,
    token: str | None = None,
) -> list[RepoInfo]:
    """Searches the Hub's models, most downloaded first.

    Args:
        query: Words the repo name must contain; empty lists the author's models.
        author: Only this user's or organisation's models; ``None`` searches all.
        limit: Most results to return.
        token: Hugging Face token; ``None`` sends none (a token saved by the
            ``hf`` command line is not used either).

    Returns:
        The matching repos.

    Raises:
        ModelError: The Hub cannot be reached or refused, with a one-line reason.
        ValueError: ``limit`` is below 1.
    """
    from huggingface_hub import HfApi

    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    _require_network()
    with _hub_errors(None, token):
        found = HfApi().list_models(
            search=query.strip() or None,
            author=author or None,
            sort="downloads",
            limit=limit,
            expand=_EXPAND,
            token=_auth(token),
        )
        return [_repo_info(model) for model in found]


def download_model(
    repo_id: str,
    models_dir: Path,
    *,
    token: str | None = None,
    progress: Callable[[DownloadProgress], None] | None = None,
    cancel: threading.Event | None = None,
    revision: str | None = None,
) -> Path:
    """Downloads an MLX model from the Hub into ``models_dir/<org>--<name>``.

    Only the top-level files an MLX model needs are fetched: ``*.json``,
    ``*.jsonl``, ``*.safetensors`` (only ``model*.safetensors`` when there are
    any), ``tokenizer.model``, ``tiktoken.model``, ``*.tiktoken``, ``*.txt`` and
    ``*.jinja``; never code (``*.py``). They go into a hidden staging folder
    that is renamed into place once complete and valid.

    Cancelling, or any failure, keeps the files that finished in the staging
    folder; calling again with the same repo and models folder resumes there
    (the file that was in flight starts over). :func:`discard_download` deletes
    such leftovers.

    Args:
        repo_id: ``org/name`` on the Hub.
        models_dir: Tandem's model folder.
        token: Hugging Face token for gated or private repos; ``None`` sends
            none (a token saved by the ``hf`` command line is not used either).
        progress: Called on the calling thread at the start and end of each
            file and as its bytes arrive.
        cancel: Checked between files and as bytes arrive. Files stored with
            Xet (``hf_xet`` installed) can only stop at the end of the file.
        revision: Branch, tag or commit; the default branch when omitted.

    Returns:
        The new model folder.

    Raises:
        ModelError: With a one-line reason: gated or missing repo, no network,
            not an MLX model, not enough disk space, the folder already exists.
        DownloadCancelled: ``cancel`` was set; finished files are kept.
    """
    report = progress or (lambda _p: None)
    _check_repo_id(repo_id)
    models_dir = Path(models_dir)
    target = models_dir / model_folder_name(repo_id)
    staging = _staging_folder(repo_id, models_dir)
    with _claimed(target, repo_id):
        _refuse_existing(target)
        _require_network()
        with _hub_errors(repo_id, token, revision):
            commit, files = _list_files(repo_id, revision, token)
        _check_cancel(cancel)
        _require_space(models_dir, staging, files, repo_id)
        try:
            staging.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _write_error(exc, repo_id, models_dir) from exc
        # Left by a crashed process: hf_hub_download never reuses them.
        _remove_incomplete(staging)

        total = sum(f.size for f in files)
        done = 0
        report(DownloadProgress(repo_id, None, 0, 0, done, total))
        for remote in files:
            _check_cancel(cancel)
            report(DownloadProgress(repo_id, remote.name, 0, remote.size, done, total))

            def on_bytes(received: int, remote: _RemoteFile = remote, base: int = done) -> None:
                report(
                    DownloadProgress(
                        repo_id, remote.name, received, remote.size, base + received, total
                    )
                )

            _fetch(repo_id, remote, staging, commit, token, revision, cancel, on_bytes)
            done += remote.size
            report(DownloadProgress(repo_id, remote.name, remote.size, remote.size, done, total))
            if remote.name == "config.json":
                # Before the weights: an unsupported model must not cost gigabytes first.
                _check_architecture(staging / "config.json", repo_id)
        _move_into_place(staging, target, repo_id, {f.name for f in files})
    report(DownloadProgress(repo_id, None, 0, 0, total, total))
    return target


def discard_download(repo_id: str, models_dir: Path) -> int:
    """Deletes what a cancelled or failed download of ``repo_id`` left behind.

    Args:
        repo_id: ``org/name`` on the Hub.
        models_dir: Tandem's model folder.

    Returns:
        The bytes freed; 0 when nothing was left.

    Raises:
        ModelError: The repo is being downloaded right now, or ``repo_id`` is invalid.
    """
    _check_repo_id(repo_id)
    staging = _staging_folder(repo_id, Path(models_dir))
    with _claimed(Path(models_dir) / model_folder_name(repo_id), repo_id):
        if not staging.is_dir() or staging.is_symlink():
            return 0
        freed = sum(f.stat().st_size for f in staging.rglob("*") if f.is_file())
        shutil.rmtree(staging)
        return freed


# --- reaching the Hub ---

NO_NETWORK = "no network: cannot reach the Hugging Face Hub"
PROBE_TIMEOUT_S = 3.0
_PROXY_VARIABLES = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
)
# Errors of a connection that says the network is down, not merely slow.
_DOWN = (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN)


def _require_network() -> None:
    """Fails at once when the Hub's host cannot be resolved or refuses to connect.

    huggingface_hub retries such a failure five times, some 25 s, before it gives up;
    one direct connection tells sooner. Behind a proxy only the proxy can connect,
    and a slow connection (a timeout) is left to huggingface_hub's own retries.

    Raises:
        ModelError: The Hub's host is unknown (no DNS), refused or unreachable.
    """
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or any(os.environ.get(v) for v in _PROXY_VARIABLES):
        return  # huggingface_hub says offline itself; a proxy is the one to ask
    url = urlsplit(constants.ENDPOINT)
    if url.hostname is None:
        return
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=PROBE_TIMEOUT_S).close()
    except (socket.gaierror, ConnectionError) as exc:
        raise ModelError(NO_NETWORK) from exc
    except TimeoutError:
        return
    except OSError as exc:
        if exc.errno in _DOWN:
            raise ModelError(NO_NETWORK) from exc


# --- listing --------------------------------------------------------------------


def _list_files(
    repo_id: str, revision: str | None, token: str | None
) -> tuple[str, list[_RemoteFile]]:
    """The commit to download and the files to fetch, small ones and config.json first."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo_id, revision=revision, files_metadata=True, token=_auth(token))
    names = [s.rfilename for s in info.siblings or [] if _wanted(s.rfilename)]
    sizes = {s.rfilename: int(s.size or 0) for s in info.siblings or []}
    if "config.json" not in names:
        raise ModelError(f"{repo_id} is not a model repo: it has no config.json")
    weights = [n for n in names if n.endswith(".safetensors")]
    if not weights:
        raise ModelError(f"{repo_id} has no .safetensors weights, so MLX cannot load it")
    if not any(n in names for n in _TOKENIZERS):
        raise ModelError(f"{repo_id} has no tokenizer (tokenizer.json or tokenizer.model)")
    # mlx-lm loads only model*.safetensors; others (consolidated.*) would be dead weight.
    if any(n.startswith("model") for n in weights):
        names = [n for n in names if not n.endswith(".safetensors") or n.startswith("model")]
    files = [_RemoteFile(n, sizes[n]) for n in names]
    files.sort(key=lambda f: (f.name.endswith(".safetensors"), f.name != "config.json", f.name))
    # Pin the commit so every file comes from one revision and kept files need no request.
    return info.sha or revision or "main", files


def _wanted(name: str) -> bool:
    # Top level only: mlx-lm never reads subfolders (original/, onnx/, ...).
    return "/" not in name and (name.endswith(_WANTED_SUFFIXES) or name in _WANTED_NAMES)


def _repo_info(model: Any) -> RepoInfo:
    return RepoInfo(
        repo_id=str(model.id),
        downloads=int(model.downloads or 0),
        likes=int(model.likes or 0),
        # The Hub says False, "auto" or "manual".
        gated=model.gated not in (None, False),
        tags=tuple(str(t) for t in model.tags or ()),
    )


# --- fetching ---------------------------------------------------------------------


def _fetch(
    repo_id: str,
    remote: _RemoteFile,
    folder: Path,
    commit: str,
    token: str | None,
    revision: str | None,
    cancel: threading.Event | None,
    on_bytes: Callable[[int], None],
) -> None:
    """Downloads one file into ``folder``, passing its bytes received to ``on_bytes``.

    ``hf_hub_download`` runs on a worker thread so that ``on_bytes`` (and so the
    caller's progress callback) always runs on the calling thread, even when
    ``hf_xet`` reports from threads of its own. The worker waits while ``on_bytes``
    runs, so a cancel set from the progress callback stops the very next chunk.
    """
    from huggingface_hub import hf_hub_download

    events: queue.SimpleQueue[tuple[str, Any, threading.Event | None]] = queue.SimpleQueue()
    stop = threading.Event()

    def should_stop() -> bool:
        return stop.is_set() or (cancel is not None and cancel.is_set())

    def send_bytes(n: int) -> None:
        seen = threading.Event()
        events.put(("bytes", n, seen))
        while not seen.wait(0.1):
            if stop.is_set():  # the calling thread left: nobody will answer
                return

    def work() -> None:
        try:
            hf_hub_download(
                repo_id,
                remote.name,
                revision=commit,
                local_dir=folder,
                token=_auth(token),
                tqdm_class=_bar_class(send_bytes, should_stop),
            )
        except BaseException as exc:  # handed to the calling thread, which raises it
            events.put(("error", exc, None))
        else:
            events.put(("done", None, None))

    worker = threading.Thread(target=work, name=f"download {remote.name}", daemon=True)
    worker.start()
    received = 0
    try:
        while True:
            kind, value, seen = events.get()
            if kind == "bytes":
                try:
                    received = max(received + value, 0)
                    on_bytes(min(received, remote.size) if remote.size else received)
                finally:
                    assert seen is not None
                    seen.set()
            elif kind == "error":
                if cancel is not None and cancel.is_set():
                    raise DownloadCancelled(f"download of {repo_id} cancelled") from value
                with _hub_errors(repo_id, token, revision, folder):
                    raise value
            else:
                return
    finally:
        stop.set()  # the progress callback may have raised: stop the worker too
        worker.join()


def _bar_class(send_bytes: Callable[[int], None], should_stop: Callable[[], bool]) -> Any:
    """A silent tqdm class that reports byte counts and stops a cancelled download.

    Raising from ``update`` ends a plain HTTP download at once, and
    ``hf_hub_download`` then deletes its temporary file. ``hf_xet`` only logs
    exceptions of its progress callback, so a Xet download runs to its end.
    """
    from tqdm import tqdm

    class _Bar(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True  # progress goes to the caller, never to stderr
            super().__init__(*args, **kwargs)
            self._stopping = False
            if kwargs.get("initial"):
                send_bytes(int(kwargs["initial"]))

        def update(self, n: float | None = 1) -> bool | None:
            if self._stopping:
                return None  # a Xet download finishing after the cancel
            if n:
                send_bytes(int(n))
            if should_stop():
                self._stopping = True  # raise once: hf_xet logs each exception
                raise DownloadCancelled("download cancelled")
            return None

        # Having these makes hf_xet report through a single bar: bytes written, not sent.
        def update_transfer(self, n: float | None = 1) -> None:
            pass

        def set_transfer_postfix_str(self, s: str = "", refresh: bool = True) -> None:
            pass

    return _Bar


# --- checks and folders --------------------------------------------------------


def _check_repo_id(repo_id: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise ModelError(f"'{repo_id}' is not a Hugging Face repo id (org/name)") from exc


def _check_architecture(config_file: Path, repo_id: str) -> None:
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelError(f"{repo_id}: config.json is unreadable") from exc
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not model_type:
        raise ModelError(f"{repo_id}: config.json names no model_type")
    try:
        importlib.import_module(f"mlx_lm.models.{model_type}")
    except ImportError as exc:
        raise ModelError(f"{repo_id}: architecture '{model_type}' is not supported") from exc


def _require_space(models_dir: Path, staging: Path, files: list[_RemoteFile], repo_id: str) -> None:
    remaining = sum(f.size for f in files if not _kept(staging / f.name, f.size))
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        return  # cannot tell; a full disk still fails cleanly while writing
    require_space(models_dir, remaining, repo_id, "{} to download")


def _kept(file: Path, size: int) -> bool:
    try:
        return file.is_file() and file.stat().st_size == size
    except OSError:
        return False


def _staging_folder(repo_id: str, models_dir: Path) -> Path:
    return models_dir / f".{model_folder_name(repo_id)}{_STAGING_SUFFIX}"


def _refuse_existing(target: Path) -> None:
    if target.exists() or target.is_symlink():
        raise ModelError(f"{target.name} already exists in {target.parent}")


def _move_into_place(staging: Path, target: Path, repo_id: str, names: set[str]) -> None:
    try:
        # Kept from an attempt at another revision; an old shard would break the model.
        for stale in staging.iterdir():
            if stale.name not in names and not stale.name.startswith(".") and stale.is_file():
                stale.unlink()
    except OSError as exc:
        raise _write_error(exc, repo_id, target.parent) from exc
    try:
        read_config(staging)
    except ModelError as exc:
        message = str(exc).replace(staging.name, repo_id)
        raise ModelError(message) from exc
    try:
        shutil.rmtree(staging / _HF_STATE, ignore_errors=True)
        with suppress(OSError):
            (staging / _HF_STATE.parent).rmdir()  # only when empty
        _refuse_existing(target)
        os.rename(staging, target)
    except OSError as exc:
        raise _write_error(exc, repo_id, target.parent) from exc


def _remove_incomplete(folder: Path) -> None:
    """Deletes hf_hub_download's temporary files under ``folder``."""
    state = folder / _HF_STATE
    if state.is_dir():
        for file in state.rglob("*.incomplete"):
            with suppress(OSError):
                file.unlink()


@contextmanager
def _claimed(target: Path, repo_id: str) -> Iterator[None]:
    key = os.path.abspath(target)
    with _active_lock:
        if key in _active:
            raise ModelError(f"{repo_id} is already being downloaded")
        _active.add(key)
    try:
        yield
    finally:
        with _active_lock:
            _active.discard(key)


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise DownloadCancelled("download cancelled")


# --- errors ---------------------------------------------------------------------


def _auth(token: str | None) -> str | bool:
    # False, not None: None would make huggingface_hub send a token saved by the hf CLI.
    return token or False


@contextmanager
def _hub_errors(
    repo_id: str | None,
    token: str | None,
    revision: str | None = None,
    folder: Path | None = None,
) -> Iterator[None]:
    """Turns what huggingface_hub raises into :class:`ModelError` with a one-line reason."""
    try:
        yield
    except (ModelError, DownloadCancelled):
        raise
    except Exception as exc:
        if folder is not None and _is_disk_full(exc):
            _remove_incomplete(folder)  # the file being written, if hf_hub_download kept it
        raise _translate(exc, repo_id, token, revision, folder) from exc


def _translate(
    exc: Exception,
    repo_id: str | None,
    token: str | None,
    revision: str | None,
    folder: Path | None,
) -> ModelError:
    from huggingface_hub.errors import (
        DisabledRepoError,
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    name = repo_id or "the Hugging Face Hub"
    what = f"download {repo_id}" if repo_id else "search the Hugging Face Hub"
    # GatedRepoError is a RepositoryNotFoundError, and every Hub error an OSError: order matters.
    if isinstance(exc, GatedRepoError):
        return ModelError(f"{name} is gated: accept its license on huggingface.co and add a token")
    if isinstance(exc, RepositoryNotFoundError):
        return ModelError(f"{name} does not exist or is private")
    if isinstance(exc, RevisionNotFoundError):
        return ModelError(f"{name} has no revision '{revision}'")
    if isinstance(exc, RemoteEntryNotFoundError):
        return ModelError(f"{name} changed on the Hub during the download; try again")
    if isinstance(exc, DisabledRepoError):
        return ModelError(f"{name} is disabled on the Hugging Face Hub")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status == 401:
            if token:
                return ModelError("the Hugging Face token was refused; check it on huggingface.co")
            return ModelError(f"{name} needs a Hugging Face token")
        if status == 429:
            return ModelError("the Hugging Face Hub is limiting requests; try again in a while")
        if status is not None and status >= 500:
            return ModelError(f"the Hugging Face Hub is failing (HTTP {status}); try again later")
        return ModelError(f"cannot {what}: the Hugging Face Hub answered HTTP {status}")
    if isinstance(exc, _network_errors()):
        return ModelError(NO_NETWORK)
    if isinstance(exc, HFValidationError):
        return ModelError(f"cannot {what}: {scrub(exc, token, 300)}")
    if isinstance(exc, OSError):
        return _write_error(exc, name, folder.parent if folder else None, token)
    return ModelError(f"cannot {what} ({scrub(exc, token, 300)})")


@functools.cache
def _network_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean the Hub is out of reach, whichever HTTP library this version uses."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    found: list[type[BaseException]] = [
        OfflineModeIsEnabled,
        LocalEntryNotFoundError,  # raised when a file's metadata request failed
        ConnectionError,
        TimeoutError,
    ]
    # huggingface_hub 2.x uses httpx2, 1.x httpx, 0.x requests.
    for module, names in (
        ("httpx2", ("TransportError",)),
        ("httpx", ("TransportError",)),
        ("requests", ("ConnectionError", "Timeout")),
    ):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        found.extend(getattr(mod, n) for n in names if isinstance(getattr(mod, n, None), type))
    return tuple(found)


def _is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _NO_SPACE


def _write_error(
    exc: OSError, name: str, folder: Path | None, token: str | None = None
) -> ModelError:
    where = f" in {folder}" if folder else ""
    if _is_disk_full(exc):
        return ModelError(f"not enough disk space to download {name}{where}")
    return ModelError(f"cannot download {name} ({scrub(exc, token, 300)})")
