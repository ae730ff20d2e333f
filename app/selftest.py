"""``tandem --self-test``: a headless check that this install (or Tandem.app) works.

Each check prints one line, ``ok``, ``FAIL`` or ``skip``, as soon as it is done.
The checks are the pieces a frozen bundle loses first: MLX and its Metal
library, Qt's platform plugin, keyring's backends, the bundled resources, a
writable data folder and the whole model path (tokenizer, mlx-lm, the engine).

Everything runs on the main thread: MLX work on a thread that is gone by the
time the interpreter exits can abort the process at exit.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

import numpy as np

from app import __version__, resource_path

Status = Literal["ok", "FAIL", "skip"]

# The files the app reads through resource_path; a bundle without them is broken.
RESOURCES = ("catalog.json", "prompts.json", "icon.svg")
_UNAVAILABLE = "token storage is unavailable: "


class Skip(Exception):  # noqa: N818 (a verdict, not an error)
    """Raised by a check that does not apply here; the message says why."""


@dataclass(frozen=True)
class Result:
    """The verdict of one check."""

    name: str
    status: Status
    detail: str

    def line(self) -> str:
        return f"{self.status:<5}{self.name}: {self.detail}"


def run_self_test(out: TextIO | None = None, data_dir: Path | None = None) -> int:
    """Runs every check and prints one line per check and a summary.

    Args:
        out: Where the lines go; standard output when omitted.
        data_dir: The data folder to check; the default one when omitted.

    Returns:
        0 when every check passed or was skipped, 1 otherwise.
    """
    out = out or sys.stdout
    frozen = " (Tandem.app)" if getattr(sys, "frozen", False) else ""
    print(
        f"Tandem {__version__} self-test{frozen}: Python {platform.python_version()}, {_system()}",
        file=out,
        flush=True,
    )
    checks: list[tuple[str, Callable[[], str]]] = [
        ("mlx", check_mlx),
        ("metal", check_metal),
        ("resources", check_resources),
        ("data", lambda: check_data_dir(data_dir)),
        ("keyring", check_keyring),
        ("model", check_model),
        # Last: a broken platform plugin can abort the process from inside Qt,
        # and by then every other line is printed.
        ("qt", check_qt),
    ]
    results = []
    for name, check in checks:
        result = run_check(name, check)
        results.append(result)
        print(result.line(), file=out, flush=True)
    failed = [r.name for r in results if r.status == "FAIL"]
    skipped = sum(r.status == "skip" for r in results)
    if failed:
        print(f"self-test FAILED: {', '.join(failed)}", file=out, flush=True)
        return 1
    print(f"self-test passed ({len(results)} checks, {skipped} skipped)", file=out, flush=True)
    return 0


def run_check(name: str, check: Callable[[], str]) -> Result:
    """Runs one check; an exception is its failure, :class:`Skip` its skip."""
    try:
        return Result(name, "ok", check())
    except Skip as exc:
        return Result(name, "skip", str(exc))
    except Exception as exc:  # a check fails in whatever way the broken piece fails
        text = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
        return Result(name, "FAIL", reason[:300])


def check_mlx() -> str:
    """MLX imports and a matmul on its default device matches numpy's."""
    import mlx.core as mx

    a, b = _operands()
    got = mx.matmul(mx.array(a), mx.array(b))
    mx.eval(got)
    _expect_close(np.array(got), a @ b)
    version = getattr(mx, "__version__", "?")
    return f"MLX {version}, matmul on {mx.default_device()} matches numpy"


def check_metal() -> str:
    """On macOS, the Metal library loads and a GPU op gives numpy's answer."""
    if sys.platform != "darwin":
        raise Skip("not macOS (MLX runs on the CPU here)")
    # else, not fall-through: mypy then skips the macOS steps elsewhere instead of
    # calling them unreachable.
    else:
        import mlx.core as mx

        if not mx.metal.is_available():
            raise RuntimeError("MLX sees no Metal device")
        a, b = _operands()
        # The first GPU op loads mlx.metallib, which must sit beside libmlx.dylib.
        got = mx.matmul(mx.array(a), mx.array(b), stream=mx.gpu) + 1.0
        mx.eval(got)
        _expect_close(np.array(got), a @ b + 1.0)
        name = mx.device_info(mx.gpu).get("device_name", "GPU")
        return f"metallib loaded, matmul on {name} matches numpy"


def check_resources() -> str:
    """The files in ``resources/`` are where :func:`app.resource_path` looks."""
    for name in RESOURCES:
        path = resource_path(name)
        if not path.is_file():
            raise FileNotFoundError(f"{name} is missing from {path.parent}")
        if path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
    return f"{', '.join(RESOURCES)} in {resource_path('').resolve()}"


def check_data_dir(data_dir: Path | None = None) -> str:
    """The data folder exists and takes an atomic write, which is then removed."""
    from app.files import write_atomic

    if data_dir is None:
        from app.store.db import default_data_dir

        data_dir = default_data_dir()
    else:
        data_dir.mkdir(parents=True, exist_ok=True)
    probe = data_dir / f".self-test-{os.getpid()}"
    payload = b"tandem self-test\n"
    try:
        write_atomic(probe, payload)
        if probe.read_bytes() != payload:
            raise OSError(f"{probe} reads back different bytes")
    finally:
        probe.unlink(missing_ok=True)
    return f"{data_dir} is writable"


def check_keyring() -> str:
    """keyring picks a usable backend; without one on macOS the bundle is broken.

    The app works without a keychain (it cannot save a Hub token, and says so),
    so elsewhere a missing keychain passes with a note. Every Mac has its
    Keychain, though: there a missing backend means the bundle lost keyring's
    backends (they are found through package metadata), so it fails.
    """
    import keyring

    from app.keychain import keyring_status

    reason = keyring_status()
    if reason is None:
        backend = keyring.get_keyring()
        return f"{type(backend).__module__}.{type(backend).__name__} is usable"
    if sys.platform == "darwin":
        raise RuntimeError(reason)
    else:  # not fall-through: mypy skips the other platform's branch, not unreachable
        return f"no keychain (tokens cannot be saved): {reason.removeprefix(_UNAVAILABLE)}"


def check_model() -> str:
    """A tiny random-weight pair is built, loaded and drafts a short greedy reply."""
    from app.engine import Finished, GenerationParams, Message, load_pair
    from app.engine.generate import stream_reply
    from app.engine.types import DraftSetting
    from app.testing.tiny import build_model

    with tempfile.TemporaryDirectory(prefix="tandem-self-test-") as tmp:
        target = build_model(Path(tmp) / "target", seed=0)
        draft = build_model(Path(tmp) / "draft", tokenizer_from=target, weights_from=target)
        pair = load_pair(target, draft)
        params = GenerationParams(
            max_tokens=4, temperature=0.0, seed=0, drafting=DraftSetting.fixed(2)
        )
        events = list(stream_reply(pair, [Message("user", "Hello")], params))
    finished = events[-1] if events else None
    if not isinstance(finished, Finished):
        raise RuntimeError("the reply did not finish")
    stats = finished.stats
    if stats.target_calls < 1 or (stats.tokens < 1 and finished.finish_reason != "stop"):
        raise RuntimeError(f"no reply ({stats.tokens} tokens, {finished.finish_reason})")
    return (
        f"tiny pair loaded and replied: {stats.tokens} tokens in {stats.target_calls} "
        f"target calls, {stats.accepted}/{stats.drafted} drafted tokens accepted"
    )


def check_qt() -> str:
    """Qt's platform plugin loads (offscreen where there is no display)."""
    from PySide6.QtCore import QLibraryInfo, qVersion
    from PySide6.QtGui import QGuiApplication

    wanted = _qt_platform()
    expected = wanted or ("cocoa" if sys.platform == "darwin" else "")
    plugins = Path(QLibraryInfo.path(QLibraryInfo.LibraryPath.PluginsPath)) / "platforms"
    # Qt aborts the process when no plugin loads; find a missing one out first.
    names = [n.split(":")[0] for n in expected.split(";") if n]
    if names and not any(any(plugins.glob(f"*q{n}.*")) for n in names):
        raise FileNotFoundError(f"no '{expected}' platform plugin in {plugins}")
    app = QGuiApplication.instance()
    created = app is None
    if app is None:
        argv = ["tandem"] + (["-platform", wanted] if wanted else [])
        app = QGuiApplication(argv)
    try:
        assert isinstance(app, QGuiApplication)
        name = app.platformName()
    finally:
        if created:
            app.shutdown()
    return f"Qt {qVersion()}, platform plugin '{name}' loaded"


def _qt_platform() -> str | None:
    """The platform to ask for: the user's choice, else offscreen without a display.

    Qt reads ``QT_QPA_PLATFORM`` as ``name[:options]``, several separated by ``;``.
    """
    chosen = os.environ.get("QT_QPA_PLATFORM")
    if chosen:
        return chosen
    headless = not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    if sys.platform.startswith("linux") and headless:
        return "offscreen"
    return None


def _operands() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((64, 32)).astype(np.float32),
        rng.standard_normal((32, 16)).astype(np.float32),
    )


def _expect_close(got: np.ndarray, want: np.ndarray) -> None:
    if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
        error = float(np.max(np.abs(got - want)))
        raise ArithmeticError(f"result differs from numpy's by up to {error:.3g}")


def _system() -> str:
    if sys.platform == "darwin":
        return f"macOS {platform.mac_ver()[0]} {platform.machine()}"
    else:  # not fall-through: mypy skips the other platform's branch, not unreachable
        return f"{platform.system()} {platform.machine()}"
