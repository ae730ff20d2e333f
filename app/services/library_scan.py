"""Scans the model library off the GUI thread.

A scan reads every model folder's config, tokenizer files and safetensors
headers, which takes a while on a slow or network disk with many models. It
runs on Qt's global thread pool, one at a time per scanner; the answer comes
back as an immutable :class:`LibraryScan`, errors included.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, QThreadPool, Signal, Slot

from app.hub.library import ModelInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LibraryScan:
    """One scan of the library.

    Attributes:
        generation: Which request this answers; a newer request drops older answers.
        models_dir: Tandem's models folder that was scanned.
        models: Every model found, sorted by name, unusable ones with their ``problem``.
        others: The folders asked for besides the library (a target chosen elsewhere).
        error: Why the library could not be read, or ``None``.
    """

    generation: int
    models_dir: Path
    models: tuple[ModelInfo, ...] = ()
    others: tuple[ModelInfo, ...] = ()
    error: str | None = None

    @property
    def usable(self) -> tuple[ModelInfo, ...]:
        """The models that passed every check."""
        return tuple(m for m in self.models if m.usable)


@dataclass(frozen=True, slots=True)
class _ScanRequest:
    generation: int
    models_dir: Path
    hf_cache_dir: Path | None
    others: tuple[Path, ...]


def _scan(request: _ScanRequest) -> LibraryScan:
    """Runs on a pool thread; never raises."""
    from app.hub import library

    try:
        models = tuple(library.scan_library(request.models_dir, request.hf_cache_dir))
        known = {m.path for m in models}
        others = tuple(library.inspect_model(p) for p in request.others if p not in known)
    except OSError as exc:
        return LibraryScan(request.generation, request.models_dir, error=str(exc))
    except Exception as exc:  # a bug must not leave the list saying "Scanning…" forever
        log.exception("library scan failed")
        return LibraryScan(request.generation, request.models_dir, error=f"Failed: {exc}")
    return LibraryScan(request.generation, request.models_dir, models, others)


class _Relay(QObject):
    """Carries a pool thread's answer to the scanner's thread (a queued signal)."""

    done = Signal(object)  # LibraryScan


class LibraryScanner(QObject):
    """Scans the library on a pool thread and keeps the latest answer.

    Signals:
        scanned: The newest requested scan's :class:`LibraryScan`; older ones are dropped.
    """

    scanned = Signal(object)  # LibraryScan

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._generation = 0
        self._pending: _ScanRequest | None = None
        self._running = False
        self._stopped = False
        self._latest: LibraryScan | None = None
        # Parentless and held by each running task too, so a task outliving this
        # scanner (its dialog closed) still has somewhere to emit.
        self._relay = _Relay()
        self._relay.done.connect(self._on_scan_done)

    @property
    def latest(self) -> LibraryScan | None:
        """The newest scan that ended, or ``None`` before the first one ends."""
        return self._latest

    @property
    def scanning(self) -> bool:
        """Whether a requested scan has not answered yet."""
        return self._running or self._pending is not None

    def scan(
        self, models_dir: Path, hf_cache_dir: Path | None = None, others: tuple[Path, ...] = ()
    ) -> int:
        """Asks for a scan of ``models_dir`` and the Hub cache; returns its generation.

        Args:
            models_dir: Tandem's models folder.
            hf_cache_dir: The Hub cache; the default cache when ``None``.
            others: Folders outside the library to describe too.
        """
        self._generation += 1
        if self._stopped:
            return self._generation
        # One scan at a time: a request while one runs waits for it, then replaces it.
        self._pending = _ScanRequest(self._generation, models_dir, hf_cache_dir, others)
        if not self._running:
            self._start_pending()
        return self._generation

    def stop(self, timeout_ms: int = 30_000) -> bool:
        """Drops answers still to come and waits for a running scan; ``False`` on timeout."""
        self._stopped = True
        self._pending = None
        return QThreadPool.globalInstance().waitForDone(timeout_ms)

    def _start_pending(self) -> None:
        request, self._pending = self._pending, None
        if request is None:
            return
        self._running = True
        relay = self._relay
        QThreadPool.globalInstance().start(lambda: relay.done.emit(_scan(request)))

    @Slot(object)
    def _on_scan_done(self, scan: LibraryScan) -> None:
        self._running = False
        if self._stopped:
            return
        if self._pending is not None:  # asked again meanwhile: this answer is stale
            self._start_pending()
            return
        if scan.generation != self._generation:
            return
        self._latest = scan
        self.scanned.emit(scan)
