#!/usr/bin/env bash
# Signs Tandem.app (or its DMG) with a Developer ID, notarizes it and staples the ticket.
#
#   packaging/sign_and_notarize.sh dist/Tandem.app          # every binary inside out, then the app
#   packaging/sign_and_notarize.sh dist/Tandem-0.1.0.dmg    # the disk image (after build_dmg.sh)
#
# Identities and credentials come from the environment, never from the repository:
#   TANDEM_SIGN_IDENTITY   the signing identity in the keychain, for example
#                          "Developer ID Application: Jane Doe (TEAMID1234)"
#   TANDEM_NOTARY_PROFILE  a profile saved with `xcrun notarytool store-credentials`, or
#   APPLE_ID, APPLE_TEAM_ID, APPLE_APP_PASSWORD   an Apple ID, its team and an
#                          app-specific password
#   TANDEM_SKIP_NOTARIZE=1 sign only (for a local check of the hardened runtime)
set -euo pipefail

die() {
    echo "sign_and_notarize.sh: $*" >&2
    exit 1
}

if [[ "$(uname -s)" != "Darwin" ]]; then
    die "codesign, notarytool and stapler are Apple's tools; run this on a Mac"
fi
[[ $# -eq 1 ]] || die "usage: sign_and_notarize.sh dist/Tandem.app | dist/Tandem-VERSION.dmg"

target="${1%/}"
here="$(cd "$(dirname "$0")" && pwd)"
entitlements="$here/entitlements.plist"
[[ -e "$target" ]] || die "$target does not exist"
[[ -n "${TANDEM_SIGN_IDENTITY:-}" ]] || die "set TANDEM_SIGN_IDENTITY to a Developer ID Application identity"

# Hardened runtime (required for notarization) and a secure timestamp on everything.
sign() {
    codesign --force --options runtime --timestamp --sign "$TANDEM_SIGN_IDENTITY" "$@"
}

# Deepest paths first, so that everything is signed before what contains it.
deepest_first() {
    awk -F/ '{ print NF "\t" $0 }' | sort -rn -k1,1 | cut -f2-
}

is_macho() {
    file -b "$1" | grep -q "Mach-O"
}

sign_app() {
    local app="$1" path
    # 1. Every loose Mach-O file: extension modules (.so), libraries (.dylib),
    #    framework binaries and helper executables. Entitlements only ever go on
    #    executables (Apple: never on libraries).
    while IFS= read -r path; do
        is_macho "$path" || continue
        if [[ "$path" != *.so && "$path" != *.dylib && -x "$path" ]]; then
            sign --entitlements "$entitlements" "$path"
        else
            sign "$path"
        fi
    done < <(find "$app/Contents" -type f \( -name "*.so" -o -name "*.dylib" -o -perm -100 \) \
        | deepest_first)
    # 2. Nested bundles (Python.framework, Qt's frameworks, helper apps), inside out.
    while IFS= read -r path; do
        if [[ "$path" == *.app ]]; then
            sign --entitlements "$entitlements" "$path"
        else
            sign "$path"
        fi
    done < <(find "$app/Contents" -type d \( -name "*.framework" -o -name "*.app" \
        -o -name "*.bundle" -o -name "*.xpc" \) | deepest_first)
    # 3. The app itself, with its entitlements.
    sign --entitlements "$entitlements" "$app"
    codesign --verify --deep --strict --verbose=2 "$app"
}

notarize() {
    local file="$1" result status id
    local -a auth
    if [[ -n "${TANDEM_NOTARY_PROFILE:-}" ]]; then
        auth=(--keychain-profile "$TANDEM_NOTARY_PROFILE")
    elif [[ -n "${APPLE_ID:-}" && -n "${APPLE_TEAM_ID:-}" && -n "${APPLE_APP_PASSWORD:-}" ]]; then
        auth=(--apple-id "$APPLE_ID" --team-id "$APPLE_TEAM_ID" --password "$APPLE_APP_PASSWORD")
    else
        die "set TANDEM_NOTARY_PROFILE, or APPLE_ID, APPLE_TEAM_ID and APPLE_APP_PASSWORD"
    fi
    result="$(mktemp)"
    # Judged by the status it reports, not its exit code, so a rejection shows its log.
    xcrun notarytool submit "$file" "${auth[@]}" --wait --output-format json >"$result" || true
    cat "$result"
    echo
    status="$(plutil -extract status raw -o - "$result" 2>/dev/null || echo "none")"
    if [[ "$status" != "Accepted" ]]; then
        if id="$(plutil -extract id raw -o - "$result" 2>/dev/null)"; then
            xcrun notarytool log "$id" "${auth[@]}" >&2 || true
        fi
        die "notarization of $file ended with status '$status'"
    fi
}

case "$target" in
    *.app)
        sign_app "$target"
        if [[ "${TANDEM_SKIP_NOTARIZE:-}" == 1 ]]; then
            exit 0
        fi
        # notarytool takes a zip, a DMG or a package; the ticket is stapled to the app.
        zip="$(mktemp -d)/$(basename "$target" .app).zip"
        ditto -c -k --keepParent "$target" "$zip"
        notarize "$zip"
        ;;
    *.dmg)
        sign "$target"
        if [[ "${TANDEM_SKIP_NOTARIZE:-}" == 1 ]]; then
            exit 0
        fi
        notarize "$target"
        ;;
    *)
        die "$target is neither an .app nor a .dmg"
        ;;
esac
xcrun stapler staple "$target"
xcrun stapler validate "$target"
