"""The test suite fails on any exception that escapes into Qt's event loop."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_pytest_qt_runs_on_pyside6_and_captures_qt_exceptions(
    pytestconfig: pytest.Config,
) -> None:
    assert pytestconfig.getini("qt_api") == "pyside6"
    assert not pytestconfig.getini("qt_no_exception_capture")


def test_an_exception_in_a_slot_fails_the_test(tmp_path: Path) -> None:
    test = tmp_path / "test_slot.py"
    test.write_text(
        textwrap.dedent(
            """
            from PySide6.QtCore import QTimer

            def test_slot_raises(qtbot):
                def broken():
                    raise ValueError("escaped into Qt")

                QTimer.singleShot(0, broken)
                qtbot.wait(50)
            """
        )
    )
    # This project's pytest settings, on a test outside the suite.
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(test),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 1, r.stdout
    assert "Exceptions caught in Qt event loop" in r.stdout
    assert "ValueError: escaped into Qt" in r.stdout
