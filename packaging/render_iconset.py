"""Renders an SVG into a macOS ``.iconset`` folder of PNGs, for ``iconutil``.

    python packaging/render_iconset.py resources/icon.svg build/Tandem.iconset

Qt renders the SVG (PySide6 is a dependency already), so making the icon needs
nothing from Homebrew; ``packaging/make_icns.sh`` runs this and ``iconutil``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The ten images iconutil expects: each size at 1x and 2x.
SIZES = (16, 32, 128, 256, 512)


def iconset_names() -> dict[str, int]:
    """File names in an iconset and the pixel size of each."""
    names = {}
    for size in SIZES:
        names[f"icon_{size}x{size}.png"] = size
        names[f"icon_{size}x{size}@2x.png"] = size * 2
    return names


def render(svg: Path, out_dir: Path) -> list[Path]:
    """Writes every iconset image of ``svg`` into ``out_dir``; returns their paths."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # no window is ever shown
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    app = QGuiApplication.instance() or QGuiApplication([sys.argv[0]])
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise ValueError(f"{svg} is not a valid SVG")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, pixels in iconset_names().items():
        image = QImage(pixels, pixels, QImage.Format.Format_ARGB32_Premultiplied)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        path = out_dir / name
        if not image.save(str(path), "PNG"):
            raise OSError(f"cannot write {path}")
        written.append(path)
    del app
    return written


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: render_iconset.py ICON.svg OUT.iconset", file=sys.stderr)
        return 2
    for path in render(Path(argv[0]), Path(argv[1])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
