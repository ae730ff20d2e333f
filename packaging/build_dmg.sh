#!/usr/bin/env bash
# Makes dist/Tandem-VERSION.dmg: Tandem.app beside a link to /Applications, to drag it onto.
#
#   packaging/build_dmg.sh [dist/Tandem.app]
#
# The version comes from the app's Info.plist. Sign and notarize the app first,
# and the DMG afterwards (packaging/sign_and_notarize.sh). Prints the DMG's path.
set -euo pipefail

die() {
    echo "build_dmg.sh: $*" >&2
    exit 1
}

if [[ "$(uname -s)" != "Darwin" ]]; then
    die "hdiutil exists only on macOS; run this on a Mac"
fi

app="${1:-dist/Tandem.app}"
app="${app%/}"
[[ -d "$app" ]] || die "$app does not exist; build it with setup_py2app.py first"
version="$(plutil -extract CFBundleShortVersionString raw -o - "$app/Contents/Info.plist")"
dmg="$(dirname "$app")/Tandem-$version.dmg"

staging="$(mktemp -d)"
trap 'rm -rf "$staging"' EXIT
# ditto keeps the bundle's symlinks, extended attributes and signatures intact.
ditto "$app" "$staging/Tandem.app"
ln -s /Applications "$staging/Applications"

rm -f "$dmg"
# hdiutil now and then fails with "Resource busy" while the system scans the
# fresh files; a second try a moment later succeeds.
for attempt in 1 2 3; do
    if hdiutil create -volname "Tandem $version" -srcfolder "$staging" -fs HFS+ -format UDZO \
        -ov "$dmg" >&2; then
        break
    fi
    [[ $attempt -lt 3 ]] || die "hdiutil create failed three times"
    sleep 10
done
hdiutil verify "$dmg" >&2
echo "$dmg"
