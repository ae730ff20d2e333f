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


def test_markers_are_strict_and_slow_is_registered(pytestconfig: pytest.Config) -> None:
    assert "--strict-markers" in pytestconfig.getini("addopts")
    assert pytestconfig.getini("xfail_strict") is True
    markers = pytestconfig.getini("markers")
    assert any(line.startswith("slow:") for line in markers)
    makefile = (ROOT / "Makefile").read_text()
    assert '-m "not slow"' in makefile.split("test-fast:", 1)[1].split("\n\n", 1)[0]


def test_linux_workflow_runs_make_test() -> None:
    import yaml

    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "linux.yml").read_text())
    (job,) = workflow["jobs"].values()
    assert job["runs-on"].startswith("ubuntu")
    assert any("make test" in step.get("run", "") for step in job["steps"])


def test_pre_commit_runs_the_same_checks_as_make_lint() -> None:
    import yaml

    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}
    assert set(hooks) == {"ruff", "ruff-format", "mypy", "lint-imports"}
    for hook in hooks.values():
        assert hook["entry"].startswith(".venv/bin/"), hook
