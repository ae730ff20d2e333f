#!/usr/bin/env bash
# Checks the layout of a built Tandem.app before it is run, signed or shipped.
#
#   packaging/check_bundle.sh [dist/Tandem.app]
#
# What `Tandem --self-test` cannot see from inside: where py2app put things.
set -euo pipefail

app="${1:-dist/Tandem.app}"
app="${app%/}"
contents="$app/Contents"
failed=0

fail() {
    echo "FAIL $*" >&2
    failed=1
}

[[ -x "$contents/MacOS/Tandem" ]] || fail "no executable Contents/MacOS/Tandem"
if command -v lipo >/dev/null && [[ -e "$contents/MacOS/Tandem" ]]; then
    lipo -archs "$contents/MacOS/Tandem" | grep -qw arm64 || fail "Contents/MacOS/Tandem is not arm64"
fi

# py2app issue #380: a top-level plugins folder makes Qt load a second copy of
# its plugins, and the cocoa platform plugin then fails to load.
[[ ! -e "$contents/plugins" ]] || fail "Contents/plugins exists (do not use py2app's qt_plugins)"
# PySide6 points Qt at its own plugins unless a qt.conf sits beside the executable.
[[ ! -e "$contents/MacOS/qt.conf" ]] || fail "Contents/MacOS/qt.conf would hide PySide6's plugins"
find "$contents" -path "*/PySide6/Qt/plugins/platforms/libqcocoa.dylib" | grep -q . ||
    fail "PySide6/Qt/plugins/platforms/libqcocoa.dylib is missing"

# MLX loads mlx.metallib from the folder that holds libmlx.dylib.
mlx_libs=0
while IFS= read -r lib; do
    mlx_libs=$((mlx_libs + 1))
    [[ -f "$(dirname "$lib")/mlx.metallib" ]] || fail "no mlx.metallib beside $lib"
done < <(find "$contents" -name "libmlx.dylib")
[[ $mlx_libs -gt 0 ]] || fail "no libmlx.dylib in the bundle (is mlx in py2app's packages?)"

for name in catalog.json prompts.json icon.svg Tandem.icns; do
    [[ -f "$contents/Resources/$name" ]] || fail "Contents/Resources/$name is missing"
done

if [[ $failed -ne 0 ]]; then
    exit 1
fi
echo "ok   $app: arm64 executable, Qt plugins in PySide6, mlx.metallib beside libmlx, resources"
