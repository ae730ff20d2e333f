"""Builds Tandem.app with py2app, on an Apple Silicon Mac.

    packaging/make_icns.sh                      # resources/Tandem.icns from icon.svg
    .venv/bin/python setup_py2app.py py2app     # dist/Tandem.app

This file imports without py2app installed, so tests can inspect its options;
packaging/README.md explains each choice.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app import __version__

ROOT = Path(__file__).resolve().parent
APP = ["packaging/tandem_app.py"]
BUNDLE_ID = "app.tandem.Tandem"
# MLX's wheels are tagged macosx_14_0_arm64: the app runs where MLX runs.
MIN_MACOS = "14.0"
ICON_SOURCE = "resources/icon.svg"
ICON_MAKER = "packaging/make_icns.sh"
# Generated (and git-ignored): the workflow runs ICON_MAKER before py2app.
ICON = "resources/Tandem.icns"


def resource_files() -> list[str]:
    """Every file in ``resources/`` except the generated icon, relative to the root.

    py2app copies data files to ``Contents/Resources``, which is where
    :func:`app.resource_path` looks in a bundle (py2app's boot script sets
    ``RESOURCEPATH`` to it and ``sys.frozen``).
    """
    folder = ROOT / "resources"
    return sorted(
        f"resources/{p.name}"
        for p in folder.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.suffix != ".icns"
    )


DATA_FILES = [("", resource_files())]

# Copied into the bundle as folders rather than into its zip of modules:
# - mlx: MLX finds mlx.metallib beside libmlx.dylib; zipped or relinked, a GPU
#   op fails with "Failed to load the default metallib".
# - PySide6, shiboken6: the Qt plugins stay in PySide6/Qt/plugins, where the
#   qt.conf that PySide6 registers at import points Qt.
# - The rest import modules by name at run time, which py2app's import scan
#   cannot see: mlx-lm's architectures, transformers' and huggingface_hub's lazy
#   modules, Jinja2 for chat templates, keyring's backends (found through
#   package metadata, which py2app copies for included packages), Pygments'
#   lexers, and certifi's CA bundle, which is a data file.
PACKAGES = [
    "app",
    "mlx",
    "mlx_lm",
    "PySide6",
    "shiboken6",
    "transformers",
    "tokenizers",
    "huggingface_hub",
    "jinja2",
    "numpy",
    "keyring",
    "platformdirs",
    "qasync",
    "pygments",
    "certifi",
]

# Packages without an __init__.py, which py2app cannot copy as they are.
NAMESPACE_PACKAGES = ["mlx"]

# Tests, dev tools and GUI toolkits Tandem does not use; plus frameworks that
# transformers imports when they are installed, so a developer's own Mac does
# not drag them in.
EXCLUDES = [
    "tests",
    "test",  # CPython's own regression tests
    "pytest",
    "_pytest",
    "pytestqt",
    "pytest_timeout",
    "mypy",
    "ruff",
    "importlinter",
    "grimp",
    "tkinter",
    "_tkinter",
    "torch",
    "tensorflow",
    "jax",
    "flax",
    "matplotlib",
    "IPython",
]

PLIST = {
    "CFBundleName": "Tandem",
    "CFBundleDisplayName": "Tandem",
    "CFBundleExecutable": "Tandem",
    "CFBundleIdentifier": BUNDLE_ID,
    "CFBundleShortVersionString": __version__,
    "CFBundleVersion": __version__,
    "CFBundleDevelopmentRegion": "en",
    "NSHumanReadableCopyright": "Free software under the Apache License 2.0",
    "LSApplicationCategoryType": "public.app-category.productivity",
    "LSMinimumSystemVersion": MIN_MACOS,
    "LSArchitecturePriority": ["arm64"],
    "NSPrincipalClass": "NSApplication",
    "NSHighResolutionCapable": True,
    # Follow the system's light or dark appearance.
    "NSRequiresAquaSystemAppearance": False,
    # No NS*UsageDescription keys: Tandem uses no camera, microphone, location,
    # contacts, calendars, photos, Bluetooth, local network or Apple Events.
    # Keychain items it creates itself and the network need none.
}

OPTIONS: dict[str, Any] = {
    "argv_emulation": False,  # Tandem opens no files handed over by the Finder
    "arch": "arm64",  # MLX ships arm64 wheels only
    "iconfile": ICON,
    "packages": PACKAGES,
    "excludes": EXCLUDES,
    # Stripping would rewrite every wheel binary for a few megabytes; signing
    # (packaging/sign_and_notarize.sh) then covers exactly what the wheels built.
    "strip": False,
    # No "qt_plugins": py2app would copy plugins to a top-level Contents/plugins,
    # where Qt loads a second copy of them and the cocoa plugin fails
    # (py2app issue #380). PySide6's own folder already holds every plugin.
    "plist": PLIST,
}


def make_regular_package(name: str) -> Path | None:
    """Gives namespace package ``name`` an empty ``__init__.py``; returns it if created.

    py2app locates the ``packages`` it copies with ``imp.find_module``, which
    cannot see namespace packages, and mlx is one (``mlx/`` has no
    ``__init__.py``). An empty one changes nothing about how mlx imports.
    """
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin not in (None, "namespace"):
        return None  # missing (py2app will say so) or already a regular package
    folders = list(spec.submodule_search_locations or [])
    if len(folders) != 1:
        raise SystemExit(f"setup_py2app: {name} is split over {folders}; cannot copy it whole")
    init = Path(folders[0]) / "__init__.py"
    init.write_text("")
    return init


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the py2app command line on Tandem's app.

    setuptools' ``setup()`` would also read ``pyproject.toml`` and fold the
    wheel's metadata (dependencies, package discovery, its license field) into
    the app's; py2app needs none of it, so the distribution is built directly.
    """
    import os

    from setuptools.dist import Distribution

    os.chdir(ROOT)  # the paths above are relative to the checkout
    dist = Distribution(
        {
            "name": "Tandem",
            "version": __version__,
            "app": APP,
            "data_files": DATA_FILES,
            "options": {"py2app": OPTIONS},
            "script_name": Path(__file__).name,
            "script_args": list(sys.argv[1:] if argv is None else argv),
        }
    )
    if not dist.parse_command_line():
        return
    if "py2app" in dist.commands:
        for name in NAMESPACE_PACKAGES:
            if init := make_regular_package(name):
                print(f"setup_py2app: created {init} so that py2app can copy {name}")
    dist.run_commands()


if __name__ == "__main__":
    main()
