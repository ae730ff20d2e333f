"""The Mac bundle's build files: py2app options, scripts, entitlements and the CI workflow.

They run only on a Mac; here the scripts run against stand-ins for Apple's
tools (codesign, notarytool, hdiutil…) that record how they were called.
"""

from __future__ import annotations

import json
import os
import plistlib
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

import setup_py2app
from app import __version__, resource_path, selftest

ROOT = Path(__file__).resolve().parents[1]
PACKAGING = ROOT / "packaging"
SCRIPTS = ("make_icns.sh", "sign_and_notarize.sh", "build_dmg.sh", "check_bundle.sh")
WORKFLOW = ROOT / ".github" / "workflows" / "macos.yml"


# --- setup_py2app.py ---------------------------------------------------------------------------


def test_setup_imports_without_py2app_or_setuptools() -> None:
    code = (
        "import sys; sys.modules['py2app'] = None; sys.modules['setuptools'] = None; "
        "import setup_py2app; print(setup_py2app.OPTIONS['plist']['CFBundleName'])"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "Tandem"


def test_bundle_identity_and_info_plist() -> None:
    plist = setup_py2app.OPTIONS["plist"]
    assert setup_py2app.APP == ["packaging/tandem_app.py"]
    assert plist["CFBundleName"] == plist["CFBundleDisplayName"] == "Tandem"
    # The workflow runs dist/Tandem.app/Contents/MacOS/Tandem.
    assert plist["CFBundleExecutable"] == "Tandem"
    assert plist["CFBundleIdentifier"] == "app.tandem.Tandem"
    assert plist["CFBundleShortVersionString"] == plist["CFBundleVersion"] == __version__
    # MLX's wheels are macosx_14_0_arm64.
    assert plist["LSMinimumSystemVersion"] == "14.0"
    assert plist["LSArchitecturePriority"] == ["arm64"]
    assert setup_py2app.OPTIONS["arch"] == "arm64"
    assert plist["NSHighResolutionCapable"] is True
    assert plist["NSRequiresAquaSystemAppearance"] is False  # follows light/dark
    assert not [key for key in plist if key.endswith("UsageDescription")]
    plistlib.dumps(plist)  # every value is one a plist can hold


def test_mlx_and_qt_are_copied_as_folders_without_qt_plugins() -> None:
    options = setup_py2app.OPTIONS
    # mlx.metallib must stay beside libmlx.dylib; Qt's plugins inside PySide6.
    assert {"mlx", "mlx_lm", "PySide6", "shiboken6", "app"} <= set(options["packages"])
    assert "qt_plugins" not in options
    assert options["argv_emulation"] is False


def test_every_listed_package_exists() -> None:
    import importlib.util

    missing = [p for p in setup_py2app.PACKAGES if importlib.util.find_spec(p) is None]
    assert missing == []


def test_namespace_packages_become_regular_for_py2app(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # py2app locates its `packages` with imp.find_module, blind to namespace packages.
    assert "mlx" in setup_py2app.NAMESPACE_PACKAGES
    (tmp_path / "nspkg").mkdir()
    (tmp_path / "nspkg" / "mod.py").write_text("X = 1\n")
    (tmp_path / "regular").mkdir()
    (tmp_path / "regular" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    created = setup_py2app.make_regular_package("nspkg")
    assert created == tmp_path / "nspkg" / "__init__.py"
    assert created.read_text() == ""
    import importlib

    importlib.invalidate_caches()
    assert setup_py2app.make_regular_package("nspkg") is None  # now a regular package
    assert setup_py2app.make_regular_package("regular") is None
    assert setup_py2app.make_regular_package("no_such_package_here") is None


def test_tests_and_dev_tools_are_excluded() -> None:
    excluded = set(setup_py2app.OPTIONS["excludes"])
    assert {"tests", "pytest", "pytestqt", "mypy", "ruff", "importlinter", "tkinter"} <= excluded
    assert not excluded & set(setup_py2app.PACKAGES)


def test_every_resource_lands_where_resource_path_finds_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    [(dest, files)] = setup_py2app.DATA_FILES
    assert dest == ""  # Contents/Resources itself
    on_disk = {
        p.name
        for p in (ROOT / "resources").iterdir()
        if p.is_file() and not p.name.startswith(".") and p.suffix != ".icns"
    }
    assert {Path(f).name for f in files} == on_disk
    assert set(selftest.RESOURCES) <= on_disk
    assert all((ROOT / f).is_file() for f in files)
    # Inside the bundle py2app sets sys.frozen and RESOURCEPATH=Contents/Resources.
    monkeypatch.setattr(sys, "frozen", "macosx_app", raising=False)
    monkeypatch.setenv("RESOURCEPATH", str(tmp_path))
    assert resource_path("catalog.json") == tmp_path / "catalog.json"


def test_icon_is_generated_from_a_source_by_a_script() -> None:
    options = setup_py2app.OPTIONS
    assert options["iconfile"] == setup_py2app.ICON == "resources/Tandem.icns"
    assert (ROOT / setup_py2app.ICON_SOURCE).is_file()
    maker = (ROOT / setup_py2app.ICON_MAKER).read_text()
    assert setup_py2app.ICON in maker
    assert setup_py2app.ICON_SOURCE in maker
    assert "iconutil --convert icns" in maker
    if (ROOT / ".git").exists():
        ignored = subprocess.run(["git", "check-ignore", "-q", setup_py2app.ICON], cwd=ROOT)
        assert ignored.returncode == 0, "the generated icon should not be committed"


def test_iconset_renders_every_size(tmp_path: Path) -> None:
    from PySide6.QtGui import QImage

    out = tmp_path / "Tandem.iconset"
    r = subprocess.run(
        [
            sys.executable,
            str(PACKAGING / "render_iconset.py"),
            str(ROOT / "resources/icon.svg"),
            out,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in out.iterdir())
    assert len(names) == 10
    for name in names:
        m = re.fullmatch(r"icon_(\d+)x\1(@2x)?\.png", name)
        assert m, name
        size = int(m.group(1)) * (2 if m.group(2) else 1)
        image = QImage(str(out / name))
        assert (image.width(), image.height()) == (size, size)
        assert image.pixelColor(size // 2, size // 2).alpha() == 255
        assert image.pixelColor(0, 0).alpha() == 0  # rounded, transparent corners


# --- entitlements --------------------------------------------------------------------------------


def test_entitlements_hold_only_justified_keys() -> None:
    with (PACKAGING / "entitlements.plist").open("rb") as f:
        entitlements = plistlib.load(f)
    assert isinstance(entitlements, dict)
    readme = (PACKAGING / "README.md").read_text()
    assert all(key in readme for key in entitlements), "explain every key in packaging/README.md"
    never = {
        "com.apple.security.get-task-allow",  # debugging; notarization refuses it
        "com.apple.security.cs.disable-library-validation",  # every library is signed by us
        "com.apple.security.cs.allow-dyld-environment-variables",
    }
    assert not never & set(entitlements)
    # The exceptions commonly added for Python apps are weighed there too.
    for key in (
        "com.apple.security.cs.allow-jit",
        "com.apple.security.cs.allow-unsigned-executable-memory",
    ):
        assert key in readme


# --- shell scripts -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCRIPTS)
def test_scripts_parse_and_are_executable(name: str) -> None:
    path = PACKAGING / name
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert path.stat().st_mode & stat.S_IXUSR, f"chmod +x packaging/{name}"
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text


def test_sign_script_has_the_key_commands() -> None:
    text = (PACKAGING / "sign_and_notarize.sh").read_text()
    for piece in (
        "codesign --force --options runtime --timestamp",
        '--entitlements "$entitlements"',
        "xcrun notarytool submit",
        "--wait",
        "xcrun stapler staple",
        "TANDEM_SIGN_IDENTITY",
        "TANDEM_NOTARY_PROFILE",
        "APPLE_APP_PASSWORD",
    ):
        assert piece in text, piece


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the refusal off macOS")
@pytest.mark.parametrize("name", ["make_icns.sh", "sign_and_notarize.sh", "build_dmg.sh"])
def test_mac_scripts_refuse_to_run_elsewhere(name: str, tmp_path: Path) -> None:
    r = subprocess.run(
        ["bash", str(PACKAGING / name), str(tmp_path / "Tandem.app")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TANDEM_SIGN_IDENTITY": "x"},
    )
    assert r.returncode == 1
    assert "on a Mac" in r.stderr


def _stub_tools(bin_dir: Path, log: Path, tools: dict[str, str]) -> dict[str, str]:
    """Python stand-ins for macOS tools; each logs its arguments as one JSON line."""
    bin_dir.mkdir(exist_ok=True)
    for name, body in tools.items():
        script = bin_dir / name
        script.write_text(
            f"#!{sys.executable}\n"
            "import json, os, sys\n"
            f"with open({str(log)!r}, 'a') as f:\n"
            f"    f.write(json.dumps([{name!r}, *sys.argv[1:]]) + '\\n')\n" + textwrap.dedent(body)
        )
        script.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


UNAME = "print('Darwin')\n"
FILE = """
with open(sys.argv[-1], 'rb') as f:
    print('Mach-O 64-bit arm64' if f.read(5) == b'MACHO' else 'data')
"""
PLUTIL = """
import plistlib
key, path = sys.argv[2], sys.argv[-1]
raw = open(path, 'rb').read()
try:
    data = json.loads(raw)
except ValueError:
    data = plistlib.loads(raw)
if key not in data:
    sys.exit(1)
print(data[key])
"""
DITTO = """
import shutil
args = [a for a in sys.argv[1:] if not a.startswith('-')]
if '-c' in sys.argv:
    open(args[-1], 'wb').close()
else:
    shutil.copytree(args[0], args[1], symlinks=True)
"""


WEBENGINE = "Contents/Resources/lib/python3.11/PySide6/Qt/lib/QtWebEngineCore.framework"
HELPER = f"{WEBENGINE}/Versions/A/Helpers/QtWebEngineProcess.app"


def _fake_app(root: Path) -> Path:
    app = root / "Tandem.app"
    files = {
        "Contents/MacOS/Tandem": "MACHO exe",
        "Contents/MacOS/python": "MACHO exe",
        "Contents/Resources/lib/python3.11/mlx/core.cpython-311-darwin.so": "MACHO so",
        "Contents/Resources/lib/python3.11/mlx/lib/libmlx.dylib": "MACHO dylib",
        "Contents/Resources/lib/python3.11/mlx/lib/mlx.metallib": "metal",
        "Contents/Resources/lib/python3.11/PySide6/Qt/lib/QtCore.framework/Versions/A/QtCore": (
            "MACHO fw"
        ),
        "Contents/Resources/lib/python3.11/PySide6/Qt/plugins/platforms/libqcocoa.dylib": (
            "MACHO plugin"
        ),
        "Contents/Frameworks/Python.framework/Versions/3.11/Python": "MACHO py",
        # A bundle inside a bundle: the helper app is signed before its framework.
        f"{WEBENGINE}/Versions/A/QtWebEngineCore": "MACHO fw",
        f"{HELPER}/Contents/MacOS/QtWebEngineProcess": "MACHO helper",
        "Contents/Resources/catalog.json": "{}",
        "Contents/Resources/prompts.json": "[]",
        "Contents/Resources/icon.svg": "<svg/>",
        "Contents/Resources/Tandem.icns": "icns",
        "Contents/Resources/run.sh": "#!/bin/sh\n",  # executable, but not Mach-O
    }
    for rel, content in files.items():
        path = app / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        if "/MacOS/" in rel or rel.endswith(("QtCore", "QtWebEngineCore", "Python", ".sh")):
            path.chmod(0o755)
    with (app / "Contents/Info.plist").open("wb") as f:
        plistlib.dump({"CFBundleShortVersionString": __version__}, f)
    return app


def test_sign_and_notarize_signs_inside_out_then_staples(tmp_path: Path) -> None:
    app = _fake_app(tmp_path)
    log = tmp_path / "calls.jsonl"
    xcrun = """
if sys.argv[1:3] == ['notarytool', 'submit']:
    print(json.dumps({'id': 'abc-123', 'status': 'Accepted'}))
"""
    tools = {"uname": UNAME, "file": FILE, "plutil": PLUTIL, "ditto": DITTO, "xcrun": xcrun}
    tools["codesign"] = ""
    env = {
        **os.environ,
        **_stub_tools(tmp_path / "bin", log, tools),
        "TANDEM_SIGN_IDENTITY": "Developer ID Application: Test (TEAM123456)",
        "APPLE_ID": "dev@example.com",
        "APPLE_TEAM_ID": "TEAM123456",
        "APPLE_APP_PASSWORD": "app-specific",
    }
    env.pop("TANDEM_NOTARY_PROFILE", None)
    r = subprocess.run(
        ["bash", str(PACKAGING / "sign_and_notarize.sh"), str(app)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    calls = _calls(log)
    signs = [c for c in calls if c[0] == "codesign" and "--sign" in c]
    signed = [Path(c[-1]) for c in signs]
    for call in signs:
        assert call[1:5] == ["--force", "--options", "runtime", "--timestamp"]
        assert call[call.index("--sign") + 1] == env["TANDEM_SIGN_IDENTITY"]
    machos = {p for p in app.rglob("*") if p.is_file() and p.read_text().startswith("MACHO")}
    assert machos <= set(signed)
    assert app / "Contents/Resources/run.sh" not in signed  # not Mach-O
    framework = app / "Contents/Resources/lib/python3.11/PySide6/Qt/lib/QtCore.framework"
    assert signed.index(framework) > signed.index(framework / "Versions/A/QtCore")
    helper = app / HELPER
    assert signed.index(helper) < signed.index(app / WEBENGINE)  # deepest bundles first
    assert "--entitlements" in signs[signed.index(helper)]
    assert signed[-1] == app  # the app last, after everything inside it
    assert "--entitlements" in signs[-1]
    dylib = next(c for c in signs if c[-1].endswith("libmlx.dylib"))
    assert "--entitlements" not in dylib  # entitlements go on executables only
    submit = next(c for c in calls if c[:3] == ["xcrun", "notarytool", "submit"])
    assert submit[3].endswith("Tandem.zip")
    assert {"--wait", "--apple-id", "--team-id", "--password"} <= set(submit)
    assert calls[-2:] == [
        ["xcrun", "stapler", "staple", str(app)],
        ["xcrun", "stapler", "validate", str(app)],
    ]
    assert calls.index(submit) > calls.index(signs[-1])


def test_sign_needs_an_identity_and_reports_a_rejection(tmp_path: Path) -> None:
    app = _fake_app(tmp_path)
    log = tmp_path / "calls.jsonl"
    xcrun = """
if sys.argv[1:3] == ['notarytool', 'submit']:
    print(json.dumps({'id': 'abc-123', 'status': 'Invalid'}))
"""
    tools = {"uname": UNAME, "file": FILE, "plutil": PLUTIL, "ditto": DITTO, "xcrun": xcrun}
    tools["codesign"] = ""
    env = {**os.environ, **_stub_tools(tmp_path / "bin", log, tools)}
    for var in ("TANDEM_SIGN_IDENTITY", "TANDEM_NOTARY_PROFILE", "APPLE_ID"):
        env.pop(var, None)
    cmd = ["bash", str(PACKAGING / "sign_and_notarize.sh"), str(app)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1
    assert "TANDEM_SIGN_IDENTITY" in r.stderr
    assert not [c for c in _calls(log) if c[0] == "codesign"]  # nothing was signed

    env["TANDEM_SIGN_IDENTITY"] = "Developer ID Application: Test (TEAM123456)"
    env["TANDEM_NOTARY_PROFILE"] = "tandem"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1
    assert "status 'Invalid'" in r.stderr
    calls = _calls(log)
    assert ["xcrun", "notarytool", "log", "abc-123", "--keychain-profile", "tandem"] in calls
    assert not [c for c in calls if c[:2] == ["xcrun", "stapler"]]


def test_build_dmg_stages_the_app_beside_an_applications_link(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    dist.mkdir()
    app = _fake_app(dist)
    log = tmp_path / "calls.jsonl"
    hdiutil = """
from pathlib import Path
if sys.argv[1] == 'create':
    src = Path(sys.argv[sys.argv.index('-srcfolder') + 1])
    link = src / 'Applications'
    print(json.dumps({'staged': sorted(p.name for p in src.iterdir()),
                      'link': os.readlink(link) if link.is_symlink() else None,
                      'app': (src / 'Tandem.app/Contents/MacOS/Tandem').is_file()}),
          file=sys.stderr)
    Path(sys.argv[-1]).write_bytes(b'dmg')
"""
    tools = {"uname": UNAME, "plutil": PLUTIL, "ditto": DITTO, "hdiutil": hdiutil}
    env = {**os.environ, **_stub_tools(tmp_path / "bin", log, tools)}
    r = subprocess.run(
        ["bash", str(PACKAGING / "build_dmg.sh"), str(app)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    dmg = dist / f"Tandem-{__version__}.dmg"
    assert r.stdout.strip() == str(dmg)
    assert dmg.is_file()
    staged = json.loads(next(line for line in r.stderr.splitlines() if line.startswith("{")))
    assert staged == {
        "staged": ["Applications", "Tandem.app"],
        "link": "/Applications",
        "app": True,
    }
    create = next(c for c in _calls(log) if c[:2] == ["hdiutil", "create"])
    assert create[create.index("-volname") + 1] == f"Tandem {__version__}"
    assert create[create.index("-format") + 1] == "UDZO"
    assert ["hdiutil", "verify", str(dmg)] in _calls(log)


def _check_bundle(app: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    log = tmp_path / "lipo.jsonl"
    env = {**os.environ, **_stub_tools(tmp_path / "bin", log, {"lipo": "print('arm64')\n"})}
    return subprocess.run(
        ["bash", str(PACKAGING / "check_bundle.sh"), str(app)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_check_bundle_accepts_a_good_layout_and_names_each_fault(tmp_path: Path) -> None:
    app = _fake_app(tmp_path)
    good = _check_bundle(app, tmp_path)
    assert good.returncode == 0, good.stderr
    (app / "Contents/plugins/platforms").mkdir(parents=True)
    (app / "Contents/Resources/lib/python3.11/mlx/lib/mlx.metallib").unlink()
    (app / "Contents/Resources/prompts.json").unlink()
    bad = _check_bundle(app, tmp_path)
    assert bad.returncode == 1
    assert "Contents/plugins exists" in bad.stderr
    assert "no mlx.metallib beside" in bad.stderr
    assert "Contents/Resources/prompts.json is missing" in bad.stderr


# --- the app's entry script ----------------------------------------------------------------------


def test_entry_script_passes_self_test_through_to_the_cli() -> None:
    r = subprocess.run(
        [sys.executable, str(PACKAGING / "tandem_app.py"), "--self-test"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1].startswith("self-test passed")


# --- the workflow --------------------------------------------------------------------------------


def _workflow() -> dict[str, Any]:
    data = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(data, dict)
    return data


def _steps() -> list[dict[str, Any]]:
    return _workflow()["jobs"]["app"]["steps"]


def _index(predicate: Any) -> int:
    return next(i for i, step in enumerate(_steps()) if predicate(step))


def test_workflow_builds_and_self_tests_on_apple_silicon() -> None:
    workflow = _workflow()
    assert True in workflow or "on" in workflow  # YAML 1.1 reads a bare `on` as true
    job = workflow["jobs"]["app"]
    assert job["runs-on"] == "macos-14"
    steps = job["steps"]
    python = next(s for s in steps if s.get("uses", "").startswith("actions/setup-python"))
    assert python["with"]["python-version"] == "3.11"
    runs = [s.get("run", "") for s in steps]
    order = [
        _index(lambda s: "make test" in s.get("run", "")),
        _index(lambda s: "pip install py2app" in s.get("run", "")),
        _index(lambda s: "packaging/make_icns.sh" in s.get("run", "")),
        _index(lambda s: "setup_py2app.py py2app" in s.get("run", "")),
        _index(lambda s: s.get("run") == "dist/Tandem.app/Contents/MacOS/Tandem --self-test"),
        _index(lambda s: "packaging/build_dmg.sh" in s.get("run", "")),
        _index(lambda s: s.get("uses", "").startswith("actions/upload-artifact")),
    ]
    assert order == sorted(order)
    upload = steps[order[-1]]
    assert upload["with"]["path"] == "${{ steps.dmg.outputs.path }}"
    assert any("check_bundle.sh" in run for run in runs)


def test_workflow_signs_only_with_secrets_and_never_inlines_them() -> None:
    job = _workflow()["jobs"]["app"]
    assert job["env"]["TANDEM_SIGN_IDENTITY"] == "${{ secrets.TANDEM_SIGN_IDENTITY }}"
    signing = [
        s
        for s in job["steps"]
        if any(word in s.get("run", "") for word in ("sign_and_notarize.sh", "security import"))
    ]
    assert len(signing) == 3  # the certificate, the app, the DMG
    for step in signing:
        assert step["if"] == "env.TANDEM_SIGN_IDENTITY != ''"
    # Secrets reach the steps through the job's env only.
    for step in job["steps"]:
        assert "secrets." not in json.dumps(step)
    signed_self_test = _index(lambda s: s.get("if") and "--self-test" in s.get("run", ""))
    assert signed_self_test > _index(
        lambda s: s.get("run") == "packaging/sign_and_notarize.sh dist/Tandem.app"
    )
