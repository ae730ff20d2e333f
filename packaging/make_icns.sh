#!/usr/bin/env bash
# Makes resources/Tandem.icns (the icon setup_py2app.py points at) from resources/icon.svg.
#
# Qt renders the SVG at the ten iconset sizes (packaging/render_iconset.py) and
# iconutil, which ships with macOS, packs them. PYTHON picks the interpreter
# (default: .venv/bin/python, which has PySide6).
set -euo pipefail

if [[ "$(uname -s)" != "Darwin" ]]; then
    echo "make_icns.sh: iconutil exists only on macOS; run this on a Mac" >&2
    exit 1
fi

cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
iconset="build/Tandem.iconset"
icns="resources/Tandem.icns"

rm -rf "$iconset"
"$python" packaging/render_iconset.py resources/icon.svg "$iconset" >/dev/null
iconutil --convert icns --output "$icns" "$iconset"
echo "$icns"
