from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.errors import ModelError
from app.hub.catalog import (
    RECOMMEND_SHARE,
    CatalogPair,
    load_catalog,
    recommend,
    suggest_drafts,
)
from app.hub.library import inspect_model
from tests.conftest import TinyModels


def _pair(name: str, memory_gb: float) -> CatalogPair:
    return CatalogPair(name, "org/t", "org/d", memory_gb, memory_gb, ("MIT", "MIT"), "")


def test_the_shipped_catalog_loads() -> None:
    pairs = load_catalog()
    assert len(pairs) >= 5
    for pair in pairs:
        for repo in (pair.target, pair.draft):
            org, _, name = repo.partition("/")
            assert org == "mlx-community" and name and "/" not in name
        assert pair.target != pair.draft
        assert all(license.strip() for license in pair.licenses)
        assert 0 < pair.download_gb < pair.memory_gb
        assert pair.name and pair.note


def test_every_shipped_pair_names_where_its_ids_were_checked() -> None:
    from app import resource_path

    data = json.loads(resource_path("catalog.json").read_text())
    assert data["verified"] is True
    assert "model cards" in data["note"]
    for entry in data["pairs"]:
        assert "unconfirmed" not in entry
        assert entry["sources"]
        for repo in (entry["target"], entry["draft"]):
            assert repo.startswith("mlx-community/")


def test_a_broken_catalog_raises_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "catalog.json"
    bad.write_text("{")
    with pytest.raises(ModelError, match=r"catalog\.json is unreadable") as info:
        load_catalog(bad)
    assert "\n" not in str(info.value)
    bad.write_text(json.dumps({"pairs": [{"name": "x"}]}))
    with pytest.raises(ModelError, match="pair 1 has no target"):
        load_catalog(bad)
    bad.write_text(json.dumps({"pairs": {}}))
    with pytest.raises(ModelError, match="no list of pairs"):
        load_catalog(bad)
    with pytest.raises(ModelError, match="unreadable"):
        load_catalog(tmp_path / "missing.json")


def test_recommend_picks_the_largest_that_fits() -> None:
    catalog = [_pair("small", 6.0), _pair("large", 48.0), _pair("medium", 23.0)]
    room = 1 / RECOMMEND_SHARE  # memory per GB a pair needs, with the margin
    assert recommend(catalog, int(24 * 10**9 * room)).name == "medium"  # type: ignore[union-attr]
    assert recommend(catalog, int(100 * 10**9 * room)).name == "large"  # type: ignore[union-attr]
    assert recommend(catalog, int(6 * 10**9 * room)).name == "small"  # type: ignore[union-attr]
    assert recommend(catalog, int(5 * 10**9 * room)) is None
    assert recommend([], 10**12) is None


def test_recommend_keeps_a_margin_of_the_memory_available() -> None:
    # The report: a 32B needing about 23 GB was offered with 23.1 GB usable.
    catalog = [_pair("small", 6.0), _pair("32b", 23.0)]
    assert 0.5 <= RECOMMEND_SHARE <= 0.85
    assert recommend(catalog, int(23.1 * 10**9)).name == "small"  # type: ignore[union-attr]
    assert recommend(catalog, int(23 * 10**9 / RECOMMEND_SHARE) + 1).name == "32b"  # type: ignore[union-attr]


def test_suggest_drafts(tiny: TinyModels, small_draft: Path, tmp_path: Path) -> None:
    broken = Path(shutil.copytree(small_draft, tmp_path / "broken"))
    (broken / "model.safetensors").unlink()
    library = [
        inspect_model(p)
        for p in (tiny.target, tiny.foreign, tiny.copy, tiny.draft, small_draft, broken)
    ]
    suggested = suggest_drafts(tiny.target, library)
    # The foreign tokenizer, the target, its full-size copy and the broken folder
    # are left out; the smallest compatible draft comes first.
    assert [m.path for m in suggested] == [small_draft, tiny.draft]
    params = [m.parameters or 0 for m in suggested]
    assert params == sorted(params)


def test_suggest_drafts_skips_a_candidate_that_breaks_during_the_check(
    tiny: TinyModels, small_draft: Path, tmp_path: Path
) -> None:
    # Usable when scanned, unreadable by the time the pair is checked.
    gone = Path(shutil.copytree(small_draft, tmp_path / "gone"))
    info = inspect_model(gone)
    shutil.rmtree(gone)
    assert suggest_drafts(tiny.target, [info, inspect_model(small_draft)]) == [
        inspect_model(small_draft)
    ]


def test_suggest_drafts_for_a_broken_target_is_empty(tiny: TinyModels, tmp_path: Path) -> None:
    assert suggest_drafts(tmp_path / "missing", [inspect_model(tiny.draft)]) == []


def test_catalog_drafts_match_the_target_by_repo_id_or_download_folder(
    tiny: TinyModels, tmp_path: Path
) -> None:
    from app.hub.catalog import catalog_drafts, installed, repo_of

    folder = tmp_path / "org--t"
    shutil.copytree(tiny.target, folder)
    downloaded = inspect_model(folder)
    cached = inspect_model(tiny.target, source="hf-cache", repo_id="ORG/T", name="ORG/T")
    plain = inspect_model(tiny.target)
    pairs = [_pair("a", 4), CatalogPair("b", "org/other", "org/d", 1, 2, ("MIT", "MIT"), "")]

    assert repo_of(downloaded) == "org/t"
    assert [p.name for p in catalog_drafts(downloaded, pairs)] == ["a"]
    assert [p.name for p in catalog_drafts(cached, pairs)] == ["a"]
    assert catalog_drafts(plain, pairs) == []  # a folder of unknown origin
    assert installed("org/t", [plain, downloaded]) == downloaded
    assert installed("org/d", [plain, downloaded]) is None


def test_recommend_local_prefers_an_installed_catalog_pair_then_the_largest_that_fits(
    tiny: TinyModels, small_draft: Path, tmp_path: Path
) -> None:
    from app.hub.catalog import recommend_local

    target = inspect_model(Path(shutil.copytree(tiny.target, tmp_path / "org--t")))
    draft = inspect_model(Path(shutil.copytree(small_draft, tmp_path / "org--d")))
    plain, other = inspect_model(tiny.draft), inspect_model(tiny.copy)
    library = [plain, draft, target, other]
    catalog = [_pair("a", 4)]  # org/t with org/d
    picked = recommend_local(library, catalog, 10**12)
    assert picked is not None and (picked.target, picked.draft) == (target, draft)
    assert picked.name == "org--t + org--d"
    # No catalog pair installed: the largest model, with its smallest suggested draft.
    picked = recommend_local(library, [], 10**12)
    assert picked is not None and picked.target.parameters == max(
        m.parameters or 0 for m in library
    )
    assert picked.draft == draft
    # Nothing fits in the memory there is.
    assert recommend_local(library, catalog, 1) is None
    assert recommend_local([], catalog, 0) is None
