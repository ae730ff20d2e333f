"""The last calibration (Tune…) of each pair, so reopening Tune… shows it again.

Results live in ``calibrations.json`` in the data folder as
:meth:`CalibrationResult.as_dict` values keyed by :func:`~app.store.settings.pair_key`,
written atomically. A missing or unreadable file, or an unreadable entry, reads
as no result.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from app.engine.calibrate import CalibrationResult
from app.files import read_entries, write_entries
from app.store.db import default_data_dir
from app.store.settings import pair_key

log = logging.getLogger(__name__)

FILE_VERSION = 1


def _plottable(result: CalibrationResult) -> bool:
    """Whether the dialog can chart ``result``: from_dict checks keys, not values."""
    numbers = all(
        isinstance(p.tps, int | float) and (p.k is None or type(p.k) is int) for p in result.points
    )
    return numbers and result.point(result.best_k) is not None


class CalibrationsFile:
    """Loads and saves the last :class:`CalibrationResult` per pair as JSON.

    Args:
        path: The file; ``calibrations.json`` in the data folder by default.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_data_dir() / "calibrations.json"

    def _read(self) -> dict[str, Any]:
        return read_entries(self.path, FILE_VERSION, "results")

    def get(self, target: str, draft: str | None) -> CalibrationResult | None:
        """The last result of this pair, or ``None`` when there is none to read."""
        raw = self._read().get(pair_key(target, draft))
        if not isinstance(raw, dict):
            return None
        try:
            result = CalibrationResult.from_dict(raw)
        except (KeyError, TypeError, ValueError, AttributeError):
            result = None
        if result is None or not _plottable(result):
            log.warning("ignoring an unreadable stored calibration")
            return None
        return result

    def put(self, target: str, draft: str | None, result: CalibrationResult) -> None:
        """Makes ``result`` the pair's last one; other pairs' results are kept.

        Raises:
            OSError: The file cannot be written.
        """
        results = self._read()
        results[pair_key(target, draft)] = result.as_dict()
        write_entries(self.path, FILE_VERSION, "results", results)
