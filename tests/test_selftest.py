"""``tandem --self-test``: the headless check the Mac bundle runs in CI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app import selftest

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ("mlx", "metal", "resources", "data", "keyring", "model", "qt")
LINE = re.compile(r"^(ok|FAIL|skip) +(\w+): (.+)$")


def _self_test(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "--self-test", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )


def _verdicts(stdout: str) -> dict[str, tuple[str, str]]:
    found = {}
    for line in stdout.splitlines():
        m = LINE.match(line)
        if m:
            assert m.group(2) not in found, f"two lines for {m.group(2)}"
            found[m.group(2)] = (m.group(1), m.group(3))
    return found


def test_self_test_passes_with_one_line_per_check() -> None:
    r = _self_test()
    assert r.returncode == 0, r.stdout + r.stderr
    verdicts = _verdicts(r.stdout)
    assert tuple(verdicts) == CHECKS
    assert all(status in ("ok", "skip") for status, _ in verdicts.values())
    if sys.platform != "darwin":
        assert verdicts["metal"] == ("skip", "not macOS (MLX runs on the CPU here)")
        assert verdicts["mlx"][1].endswith("matmul on Device(cpu, 0) matches numpy")
    assert "platform plugin 'offscreen' loaded" in verdicts["qt"][1]
    assert "tiny pair loaded and replied" in verdicts["model"][1]
    assert r.stdout.splitlines()[-1].startswith(f"self-test passed ({len(CHECKS)} checks, ")
    assert "terminate called" not in r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_unwritable_data_folder_fails(tmp_path: Path) -> None:
    # A file where the folders should be: no one, not even root, can create them.
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    env = {"HOME": str(blocker / "home"), "XDG_DATA_HOME": str(blocker / "data")}
    r = _self_test(env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    verdicts = _verdicts(r.stdout)
    assert verdicts["data"][0] == "FAIL"
    assert str(blocker) in verdicts["data"][1]
    assert verdicts["mlx"][0] == "ok"  # the other checks still run and report
    assert tuple(verdicts) == CHECKS
    assert r.stdout.splitlines()[-1] == "self-test FAILED: data"
    assert "terminate called" not in r.stderr


def test_data_dir_option_is_the_folder_checked(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    r = _self_test("--data-dir", str(tmp_path / "file" / "data"))
    assert r.returncode == 1
    status, detail = _verdicts(r.stdout)["data"]
    assert status == "FAIL"
    assert str(tmp_path / "file") in detail


def test_data_check_leaves_nothing_behind(tmp_path: Path) -> None:
    assert "is writable" in selftest.check_data_dir(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_skips_pass_and_failures_fail(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    def skip() -> str:
        raise selftest.Skip("not here")

    def broken() -> str:
        raise ValueError("first line\nsecond line")

    for name in ("check_mlx", "check_resources", "check_keyring", "check_model", "check_qt"):
        monkeypatch.setattr(selftest, name, lambda: "fine")
    monkeypatch.setattr(selftest, "check_metal", skip)
    monkeypatch.setattr(selftest, "check_data_dir", lambda _dir: "fine")
    assert selftest.run_self_test() == 0
    lines = capsys.readouterr().out.splitlines()
    assert "skip metal: not here" in lines
    assert "ok   qt: fine" in lines
    assert lines[-1] == f"self-test passed ({len(CHECKS)} checks, 1 skipped)"

    monkeypatch.setattr(selftest, "check_model", broken)
    assert selftest.run_self_test() == 1
    lines = capsys.readouterr().out.splitlines()
    assert "FAIL model: ValueError: first line" in lines
    assert lines[-1] == "self-test FAILED: model"


def test_missing_keychain_is_a_note_except_on_a_mac(monkeypatch: pytest.MonkeyPatch) -> None:
    import app.keychain

    reason = "token storage is unavailable: no system keychain was found"
    monkeypatch.setattr(app.keychain, "keyring_status", lambda: reason)
    monkeypatch.setattr(sys, "platform", "linux")
    result = selftest.run_check("keyring", selftest.check_keyring)
    assert result.status == "ok"
    assert result.detail == "no keychain (tokens cannot be saved): no system keychain was found"
    # Every Mac has a Keychain: no backend there means the bundle lost keyring's backends.
    monkeypatch.setattr(sys, "platform", "darwin")
    assert selftest.run_check("keyring", selftest.check_keyring).status == "FAIL"


def test_missing_platform_plugin_fails_before_qt_can_abort(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QT_QPA_PLATFORM", "nosuchplatform")
    result = selftest.run_check("qt", selftest.check_qt)
    assert result.status == "FAIL"
    assert "no 'nosuchplatform' platform plugin" in result.detail


def test_missing_resource_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "catalog.json").write_text("{}")
    monkeypatch.setattr(selftest, "resource_path", lambda name: tmp_path / name)
    result = selftest.run_check("resources", selftest.check_resources)
    assert result.status == "FAIL"
    assert "prompts.json is missing" in result.detail
