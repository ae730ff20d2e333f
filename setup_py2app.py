"""Builds Tandem.app with py2app (on macOS: ``python setup_py2app.py py2app``).

A first version: a later change adds the icon, signing, the DMG and CI checks.
This file imports without py2app installed so its options can be inspected.
"""

from __future__ import annotations

from app import __version__

APP = ["packaging/tandem_app.py"]
DATA_FILES = [("", ["resources/icon.svg"])]
OPTIONS = {
    "argv_emulation": False,
    "arch": "arm64",
    "packages": ["app", "mlx", "mlx_lm", "PySide6", "qasync", "keyring", "platformdirs"],
    "excludes": ["tests", "pytest", "pytestqt", "mypy", "ruff", "importlinter", "tkinter"],
    "plist": {
        "CFBundleName": "Tandem",
        "CFBundleDisplayName": "Tandem",
        "CFBundleIdentifier": "app.tandem.Tandem",
        "CFBundleShortVersionString": __version__,
        "CFBundleVersion": __version__,
        "LSMinimumSystemVersion": "14.0",
        "LSArchitecturePriority": ["arm64"],
        "NSHighResolutionCapable": True,
        "NSRequiresAquaSystemAppearance": False,
    },
}


def main() -> None:
    from setuptools import setup

    setup(
        name="Tandem",
        version=__version__,
        app=APP,
        data_files=DATA_FILES,
        options={"py2app": OPTIONS},
        setup_requires=["py2app"],
    )


if __name__ == "__main__":
    main()
