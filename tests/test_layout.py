"""The layout says what is what: every package is in the README, support code is off the path."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"


def _table() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("## How it is built", 1)[1].split("\n\n", 2)[1]


def test_the_readme_table_names_every_package() -> None:
    table = _table()
    packages = sorted(p.parent.name for p in APP.glob("*/__init__.py"))
    assert packages, "no packages found"
    missing = [name for name in packages if f"`app/{name}/`" not in table]
    assert not missing, f"add these to the README's How it is built table: {missing}"


def test_test_and_benchmark_support_is_off_the_inference_path() -> None:
    engine = {p.stem for p in (APP / "engine").glob("*.py")}
    assert not engine & {"tiny", "synthetic", "bench"}
    assert (APP / "testing" / "tiny.py").is_file()
    assert (APP / "testing" / "synthetic.py").is_file()
    assert (APP / "bench" / "bench.py").is_file()


def test_user_facing_errors_have_one_home() -> None:
    import app.engine
    import app.engine.loader
    import app.errors

    for name in ("ModelError", "IncompatiblePairError", "first_line", "one_line"):
        assert getattr(app.engine.loader, name) is getattr(app.errors, name)
    assert app.engine.ModelError is app.errors.ModelError
    defined = [
        path.relative_to(ROOT)
        for path in APP.rglob("*.py")
        if "def first_line(" in path.read_text() or "class ModelError(" in path.read_text()
    ]
    assert defined == [Path("app/errors.py")]


def test_the_architecture_page_draws_threads_layers_and_a_tokens_path() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    for heading in ("## Layers", "## Threads", "## The path of a token"):
        assert heading in page
