"""Whether Qt can open a window here, asked before Qt aborts the process over it.

Qt ends the process (qFatal) when its platform plugin cannot be loaded, with a long
message that does not say which system package is missing. On Linux the xcb plugin
needs X11 libraries a minimal system lacks, so Tandem loads the plugin itself first
and, should libraries be missing, says which packages to install: all of them at
once, from ``ldd``, since the loader names only the first it missed.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QLibraryInfo

# "libxcb-cursor.so.0: cannot open shared object file: No such file or directory"
_MISSING = re.compile(r"(lib[\w+.-]+?)\.so\.(\d+)")
# ldd's line for each library it cannot find: "\tlibxcb-cursor.so.0 => not found"
_NOT_FOUND = re.compile(r"^\s*(\S+) => not found", re.MULTILINE)


def _xcb_plugin() -> Path:
    plugins = QLibraryInfo.path(QLibraryInfo.LibraryPath.PluginsPath)
    return Path(plugins) / "platforms" / "libqxcb.so"


def debian_package(soname: str) -> str:
    """The Debian/Ubuntu package of a library: libxcb-cursor.so.0 is libxcb-cursor0.

    Args:
        soname: The library's file name, as the dynamic loader reports it.
    """
    match = _MISSING.search(soname)
    if match is None:
        return soname
    name, version = match.groups()
    # Package names are lower case; a name that ends in a digit keeps it apart from
    # the version: libxkbcommon-x11-0.
    name = name.lower()
    return f"{name}-{version}" if name[-1].isdigit() else f"{name}{version}"


def platform_problem(
    load: Callable[[str], object] | None = None,
    plugin: Callable[[], Path] | None = None,
) -> str | None:
    """One line saying what the window needs installed, or ``None`` when nothing.

    Only Linux's X11 plugin is checked: another platform (offscreen, wayland, macOS's
    cocoa) is left to Qt. Loading the plugin here costs nothing: Qt loads it next anyway.

    Args:
        load: Loads a shared library, raising :class:`OSError` when it cannot
            (:class:`ctypes.CDLL` when omitted).
        plugin: Where Qt's xcb plugin is (Qt's own when omitted).
    """
    chosen = os.environ.get("QT_QPA_PLATFORM", "").split(":")[0]
    if not sys.platform.startswith("linux") or chosen not in ("", "xcb"):
        return None
    # else, not fall-through: mypy then skips the Linux steps elsewhere instead of
    # calling them unreachable.
    else:
        if not chosen and os.environ.get("WAYLAND_DISPLAY"):
            return None  # Qt may open the window on Wayland without X11's libraries
        path = (plugin or _xcb_plugin)()
        if not path.is_file():
            return None  # a Qt built without xcb: Qt says what it has
        try:
            (load or ctypes.CDLL)(str(path))
        except OSError as exc:
            if (match := _MISSING.search(str(exc))) is None:
                return f"Tandem cannot load Qt's X11 plugin: {exc}"
            missing = list(dict.fromkeys([match.group(0), *missing_libraries(path)]))
            packages = " ".join(dict.fromkeys(debian_package(m) for m in missing))
            which = f"{missing[0]} is" if len(missing) == 1 else f"{', '.join(missing)} are"
            return (
                f"Tandem needs the X11/xcb libraries: sudo apt install {packages} ({which} missing)"
            )
        return None


def missing_libraries(path: Path) -> list[str]:
    """Every library ``path`` needs that the loader cannot find, from ``ldd``, in its order.

    Empty when ``ldd`` is not there or fails: the loader's own error names one.
    """
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    try:
        result = subprocess.run(
            [ldd, str(path)], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [m for m in _NOT_FOUND.findall(result.stdout) if _MISSING.search(m)]
