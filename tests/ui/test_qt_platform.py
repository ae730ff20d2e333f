"""Tandem's own line when Qt's X11 plugin cannot load, before Qt aborts over it."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from app import cli
from app.ui import application
from app.ui.qt_platform import debian_package, platform_problem

MISSING = "libxcb-cursor.so.0: cannot open shared object file: No such file or directory"


def _refuse(_path: str) -> object:
    raise OSError(MISSING)


def _plugin(tmp_path: Path) -> Path:
    plugin = tmp_path / "libqxcb.so"
    plugin.write_bytes(b"")
    return plugin


def test_a_missing_x11_library_is_named_with_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr("sys.platform", "linux")
    assert platform_problem(_refuse, lambda: _plugin(tmp_path)) == (
        "Tandem needs the X11/xcb libraries: sudo apt install libxcb-cursor0 "
        "(libxcb-cursor.so.0 is missing)"
    )
    assert platform_problem(lambda _p: None, lambda: _plugin(tmp_path)) is None
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")  # not X11: left to Qt
    assert platform_problem(_refuse, lambda: _plugin(tmp_path)) is None


def test_package_names_follow_debian() -> None:
    assert debian_package("libxkbcommon-x11.so.0") == "libxkbcommon-x11-0"
    assert debian_package("libX11-xcb.so.1") == "libx11-xcb1"
    assert debian_package("libxcb-icccm.so.4") == "libxcb-icccm4"


def test_tandem_prints_the_line_instead_of_starting_qt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import app.ui.qt_platform as qt_platform

    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.setattr("sys.platform", "linux")
    monkeypatch.setattr(qt_platform, "_xcb_plugin", lambda: _plugin(tmp_path))
    monkeypatch.setattr(ctypes, "CDLL", _refuse)  # the module qt_platform loads through
    started: list[object] = []

    def run_app(*a: object, **_k: object) -> int:
        started.append(a)
        return 0

    monkeypatch.setattr(application, "run_app", run_app)
    assert cli.main(["--data-dir", str(tmp_path)]) == 2
    assert started == []
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "Tandem needs the X11/xcb libraries: sudo apt install libxcb-cursor0 "
        "(libxcb-cursor.so.0 is missing)"
    ]


def test_every_missing_x11_library_is_named_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr("sys.platform", "linux")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ldd = bin_dir / "ldd"  # what ldd says of a plugin with three libraries missing
    ldd.write_text(
        "#!/bin/sh\n"
        "printf '\\tlibQt6XcbQpa.so.6 => /qt/lib/libQt6XcbQpa.so.6 (0x1)\\n'\n"
        "printf '\\tlibxcb-cursor.so.0 => not found\\n'\n"
        "printf '\\tlibxkbcommon-x11.so.0 => not found\\n'\n"
        "printf '\\tlibxcb-icccm.so.4 => not found\\n'\n"
    )
    ldd.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert platform_problem(_refuse, lambda: _plugin(tmp_path)) == (
        "Tandem needs the X11/xcb libraries: sudo apt install libxcb-cursor0 "
        "libxkbcommon-x11-0 libxcb-icccm4 (libxcb-cursor.so.0, libxkbcommon-x11.so.0, "
        "libxcb-icccm.so.4 are missing)"
    )
