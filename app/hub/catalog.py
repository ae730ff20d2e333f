"""Recommended target and draft pairs, and draft suggestions from the library.

The catalog lives in ``resources/catalog.json``. Each pair lists the model
cards or public code where its repo ids were checked (``sources``); the file is
``verified`` only when every id was found.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app import resource_path
from app.errors import ModelError, first_line
from app.hub.demo import DEMO_PAIR
from app.hub.library import ModelInfo
from app.hub.pair_check import check_pair

_GB = 1000**3  # the catalog's sizes are decimal, as the Hub and Finder show them
# The most of the usable memory a recommended pair may need: the catalog's sizes
# are estimates, and other apps and a longer context grow into the rest.
RECOMMEND_SHARE = 0.8


@dataclass(frozen=True, slots=True)
class CatalogPair:
    """One recommended pair.

    Attributes:
        name: Display name.
        target: The target's Hub repo id.
        draft: The draft's Hub repo id.
        download_gb: Approximate download of both models, in GB.
        memory_gb: Approximate memory both need at 8,192 tokens of context, in GB.
        licenses: The target's and the draft's license.
        note: A short note for the user.
        command: The shell command that installs, headless, a pair the Hub does not serve
            (:data:`DEMO`); ``""`` for Hub pairs, which the app downloads.
    """

    name: str
    target: str
    draft: str
    download_gb: float
    memory_gb: float
    licenses: tuple[str, str]
    note: str
    command: str = ""


DEMO_COMMAND = "tandem models demo"  # `make demo-models` in the source folder
# The float32 demo pair, for MLX on a CPU, where 4-bit and float16 weights are slow
# (README). Memory: float32 weights of both (the GGUFs' lm_heads are untied, about
# 9.6 GB) plus float32 KV caches at 8,192 tokens (1.2 GB), plus 10% overhead.
DEMO = CatalogPair(
    name="Qwen2.5-Coder 1.5B Instruct + 0.5B, float32",
    target=DEMO_PAIR[0].name,
    draft=DEMO_PAIR[1].name,
    download_gb=round(sum(m.size for m in DEMO_PAIR) / _GB, 1),
    memory_gb=11.8,
    licenses=("Apache-2.0", "Apache-2.0"),
    note="MLX runs on this computer's CPU, where float32 models are fast and the 4-bit "
    "pairs of the Hub are slow; this pair comes from PyPI.",
    command=DEMO_COMMAND,
)


def load_catalog(path: Path | None = None) -> list[CatalogPair]:
    """Reads the recommended pairs.

    Args:
        path: A catalog file; ``resources/catalog.json`` when omitted.

    Returns:
        The pairs in file order.

    Raises:
        ModelError: The file is missing or malformed; the message is one line.
    """
    path = path or resource_path("catalog.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path.name} is unreadable ({first_line(exc)})") from exc
    entries = data.get("pairs") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ModelError(f"{path.name} has no list of pairs")
    pairs = []
    for i, entry in enumerate(entries):
        try:
            pairs.append(_pair(entry))
        except KeyError as exc:
            raise ModelError(f"{path.name}: pair {i + 1} has no {exc.args[0]}") from exc
        except (TypeError, ValueError) as exc:
            raise ModelError(f"{path.name}: pair {i + 1} is malformed ({first_line(exc)})") from exc
    return pairs


def recommend(catalog: list[CatalogPair], available_bytes: int) -> CatalogPair | None:
    """Picks the largest pair that fits in memory with room to spare.

    Args:
        catalog: The pairs to choose from.
        available_bytes: Memory MLX can use, e.g. from ``fit.usable_memory_bytes``.

    Returns:
        The pair with the largest ``memory_gb`` within :data:`RECOMMEND_SHARE`
        of ``available_bytes``, or ``None`` when none fits so.
    """
    fitting = [p for p in catalog if p.memory_gb * _GB <= available_bytes * RECOMMEND_SHARE]
    return max(fitting, key=lambda p: (p.memory_gb, p.download_gb), default=None)


def recommend_for_machine(
    catalog: list[CatalogPair], available_bytes: int, gpu: bool
) -> CatalogPair | None:
    """The first-run pair: :func:`recommend`'s on a GPU, :data:`DEMO` on MLX's CPU backend.

    Args:
        catalog: The Hub pairs, all 4-bit.
        available_bytes: Memory MLX can use.
        gpu: Whether MLX computes on a GPU (:func:`mlx_runs_on_gpu`).
    """
    return recommend(catalog if gpu else [DEMO], available_bytes)


def mlx_runs_on_gpu() -> bool:
    """Whether MLX computes on a GPU (Metal on a Mac, CUDA), not on the CPU."""
    import mlx.core as mx

    return bool(mx.default_device() == mx.gpu)


@dataclass(frozen=True, slots=True)
class LocalPair:
    """A pair of models already in the library.

    Attributes:
        target: The target model.
        draft: Its draft, or ``None`` when no model in the library can draft for it.
    """

    target: ModelInfo
    draft: ModelInfo | None

    @property
    def name(self) -> str:
        """``target + draft``, or the target's name alone."""
        return self.target.name + (f" + {self.draft.name}" if self.draft else "")


def recommend_local(
    library: list[ModelInfo], catalog: list[CatalogPair], available_bytes: int
) -> LocalPair | None:
    """Picks the pair to offer from the models already downloaded.

    A catalog pair whose two models are both installed comes first, the largest
    that :func:`recommend` would pick; otherwise the largest usable model whose
    weights fit within :data:`RECOMMEND_SHARE` of ``available_bytes``, with its
    best suggested draft.

    Args:
        library: Models to choose from, e.g. from ``library.scan_library``.
        catalog: The recommended pairs.
        available_bytes: Memory MLX can use; ``0`` when unknown (nothing is left out).

    Returns:
        The pair, or ``None`` when no usable model fits.
    """
    installed_pairs = {
        p: (t, d)
        for p in catalog
        if (t := installed(p.target, library)) and (d := installed(p.draft, library))
    }
    best = recommend(list(installed_pairs), available_bytes or 10**15)
    if best is not None:
        target, draft = installed_pairs[best]
        return LocalPair(target, draft)
    room = available_bytes * RECOMMEND_SHARE if available_bytes else float("inf")
    fitting = [m for m in library if m.usable and m.size_bytes <= room]
    if not fitting:
        return None
    target = max(fitting, key=lambda m: (m.parameters or 0, m.size_bytes))
    drafts = suggest_drafts(target.path, library)
    return LocalPair(target, drafts[0] if drafts else None)


def suggest_drafts(target: Path, library: list[ModelInfo]) -> list[ModelInfo]:
    """Lists the library's models that can draft for ``target``, best first.

    Args:
        target: The target model folder.
        library: Models to consider, e.g. from ``library.scan_library``.

    Returns:
        The models whose pair check with ``target`` is compatible, of at most
        half its parameters (:attr:`Verdict.suggested`), fewest parameters
        first (a smaller draft costs less per proposed token).
        Broken folders, the target itself and models whose check fails to run
        are left out; a broken target leaves out every candidate.
    """
    target = Path(target).expanduser()
    target_key = _key(target)
    found = []
    for info in library:
        if not info.usable or _key(info.path) == target_key:
            continue
        try:
            verdict = check_pair(target, info.path)
        except ModelError:
            continue  # one unreadable candidate must not hide the others
        if verdict.suggested:
            found.append(info)
    return sorted(found, key=lambda m: (m.parameters is None, m.parameters or 0, m.name.casefold()))


def repo_of(info: ModelInfo) -> str | None:
    """The Hub repo id of a library model: known for the cache, else from its folder.

    Downloads land in ``<models>/<org>--<name>``, so that name gives the id back.
    """
    if info.repo_id:
        return info.repo_id
    org, sep, name = info.path.name.partition("--")
    return f"{org}/{name}" if sep and org and name else None


def catalog_drafts(target: ModelInfo, catalog: list[CatalogPair]) -> list[CatalogPair]:
    """Catalog pairs whose target is ``target``, for drafts not yet downloaded."""
    repo = repo_of(target)
    if repo is None:
        return []
    return [p for p in catalog if p.target.casefold() == repo.casefold()]


def installed(repo: str, library: list[ModelInfo]) -> ModelInfo | None:
    """The library's usable copy of Hub repo ``repo``, if any."""
    for info in library:
        if info.usable and (repo_of(info) or "").casefold() == repo.casefold():
            return info
    return None


def _pair(entry: Any) -> CatalogPair:
    if not isinstance(entry, dict):
        raise TypeError("not a JSON object")
    texts = {}
    for key in ("name", "target", "draft", "target_license", "draft_license", "note"):
        value = entry[key]
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{key} is not text")
        texts[key] = value
    sizes = {}
    for key in ("download_gb", "memory_gb"):
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError(f"{key} is not a positive number")
        sizes[key] = float(value)
    return CatalogPair(
        name=texts["name"],
        target=texts["target"],
        draft=texts["draft"],
        download_gb=sizes["download_gb"],
        memory_gb=sizes["memory_gb"],
        licenses=(texts["target_license"], texts["draft_license"]),
        note=texts["note"],
    )


def _key(path: Path) -> Path:
    try:
        return path.expanduser().resolve()
    except OSError:
        return path
