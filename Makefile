# The two commands of the README: `make demo` and `make test`. Everything they need is set up here.
# Also: `make test-fast` (the tests that need no browser, PostgreSQL, server process, corpus or
# whole timed run), `make check` (lint, format and types), `make format`, `make screenshot`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q
# pip byte-compiles what it installs, and it must: where PYTHONDONTWRITEBYTECODE is set (these
# machines set it) Python never writes a .pyc itself, so without pip's every process the suite
# starts would compile torch, FastAPI and the rest from source.
INSTALL := $(PIP) install
# Pinned: on these machines torch==2.13.0 is a local CPU build; a range would pull CUDA wheels.
TORCH  := torch==2.13.0
# Our two packages; the server with its `postgres` extra (psycopg 3) so that the demo can be
# pointed at PostgreSQL and the tests run on it too.
PKGS   := ./trainer_hook './backend[postgres]'

.PHONY: demo test test-fast check format screenshot bench bench-dashboard bench-storage bench-distributed bench-compare bench-ranks setup setup-test system-deps clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Dependencies change rarely: install them once per change of the files that declare them
# (this Makefile included: it picks the extras).
$(VENV)/.stamp-deps: $(BIN)/python trainer_hook/pyproject.toml backend/pyproject.toml constraints.txt Makefile
	$(BIN)/python -c "import torch" 2>/dev/null || $(INSTALL) $(TORCH)
	$(INSTALL) -c constraints.txt $(PKGS)
	touch $@

$(VENV)/.stamp-test-deps: $(VENV)/.stamp-deps requirements-test.txt
	$(INSTALL) -c constraints.txt -r requirements-test.txt
	touch $@

# The dashboard's browser code from the npm registry (vendor/package-lock.json pins it): Plotly's
# basic bundle, copied into frontend/ so that the server and the wheel serve it.
PLOTLY_JS := frontend/vendor/plotly.min.js
$(PLOTLY_JS): vendor/package.json vendor/package-lock.json scripts/install-vendor-js.sh
	./scripts/install-vendor-js.sh

# Our own code is reinstalled every time (non-editable, as users get it: the wheel must carry
# the dashboard), without touching the dependencies.
setup: $(VENV)/.stamp-deps $(PLOTLY_JS)
	$(INSTALL) --no-deps --force-reinstall $(PKGS)

# The system packages first: on a fresh machine they include npm, which `setup` then finds (one
# apt-get update for all, not one for npm and another for the rest).
setup-test: system-deps setup $(VENV)/.stamp-test-deps

system-deps:
	./scripts/install-system-deps.sh

demo: setup
	./scripts/demo.sh

# Both cores: the tests run on three pytest-xdist workers, a test file per worker so that a module's
# fixtures are built once, the longest files first (tests/support/schedule.py: xdist's own order,
# by number of tests, is off); those whose assertions time something (the `timed` marker: a test,
# or a module of tests/integration) run afterwards on a quiet machine. Both always run; either failing fails the target.
# Three workers on CI's two cores: the parallel tier's tests wait much of their time (a server's
# start, a hook's pace, a browser), so two workers left about a quarter of both cores idle
# (docs/development.md, "How long the suite takes"); the third fills it. Each worker's torch
# takes one intra-op thread (OMP_NUM_THREADS=1, as the processes the tests start already do):
# three workers of two threads each would only contend for the two cores.
# The timed tier collects only the modules whose text marks a test `timed` (TIMED_MODULES), not
# the whole suite for its few tests (about 10 s); tests/conftest.py fails any collection where a
# `timed` test's module does not say `mark.timed`, so none is left out of both tiers.
# `make test CHECK=1` (what CI runs) also runs `make check` beside the parallel tier, whose waits
# leave the cores part idle, and prints its log after it; the timed tier starts once it is done.
TIMED_MODULES = $(shell grep -rlE --include='test_*.py' 'mark\.timed' tests | sort)
test: setup-test
	if [ -n "$(CHECK)" ]; then $(MAKE) --no-print-directory check > .check.log 2>&1 & fi; checking=$$!; \
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder -m "not timed" --durations=10; parallel=$$?; \
	checked=0; if [ -n "$(CHECK)" ]; then wait $$checking; checked=$$?; echo "== make check (exit $$checked)"; cat .check.log; fi; \
	$(BIN)/python -m pytest -m timed --durations=10 $(TIMED_MODULES); timed=$$?; \
	test $$parallel -eq 0 && test $$timed -eq 0 && test $$checked -eq 0

# The tiers are markers each test module declares (tests/support/tiers.py; pytest.ini lists them).
# The fast tier runs on every core (pytest-xdist), a test file per worker so that a module's fixtures
# are built once.
FAST := not (browser or postgres or server or corpus or integration)
test-fast: setup $(VENV)/.stamp-test-deps
	$(BIN)/python -m pytest -n auto --dist loadfile --no-loadscope-reorder -m "$(FAST)"

# Lint, format and types (ruff.toml; mypy's strict setting in each package's pyproject.toml).
# The tools are pinned in requirements-test.txt.
LINTED := backend trainer_hook tests benchmarks examples
# The two packages' mypy runs side by side, one a core: each is one process (on a fresh clone,
# without its cache, about 45 s and 60 s), so run in turn they left the second core idle.
check: $(VENV)/.stamp-test-deps
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/vermin --quiet --no-tips --violations -t=3.9- trainer_hook/gradwatch
	(cd backend && ../$(BIN)/mypy) & backend=$$!; \
	(cd trainer_hook && ../$(BIN)/mypy); hook=$$?; \
	wait $$backend && test $$hook -eq 0

# What `check` asks of the layout, applied: imports sorted, then the formatter.
format: $(VENV)/.stamp-test-deps
	$(BIN)/ruff check --select I --fix $(LINTED)
	$(BIN)/ruff format $(LINTED)

# The README's screenshot, docs/screenshot.png, redrawn from a real training run in Chromium
# (the test that draws it writes it under its temporary folder otherwise).
screenshot: setup-test
	GRADWATCH_SCREENSHOT=$(CURDIR)/docs/screenshot.png $(BIN)/python -m pytest -q \
		tests/browser/test_dashboard.py -k test_real_training_streams_live_and_draws_the_readme_screenshot

# The peers the overhead benchmark compares with (TensorBoard, wandb) go into .venv for it only.
$(VENV)/.stamp-bench-peers: $(VENV)/.stamp-test-deps benchmarks/requirements-peers.txt
	$(INSTALL) -c constraints.txt -r benchmarks/requirements-peers.txt
	touch $@

# MLflow, the peer of the storage benchmark, gets a venv of its own (see the requirements file).
BENCH_VENV := .venv-bench
$(BENCH_VENV)/.stamp: benchmarks/requirements-mlflow.txt
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip --disable-pip-version-check -q install -r benchmarks/requirements-mlflow.txt
	touch $@

bench: setup-test $(VENV)/.stamp-bench-peers $(BENCH_VENV)/.stamp
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/unmeasured_step.py
	$(BIN)/python benchmarks/distributed.py
	$(BIN)/python benchmarks/dashboard.py
	$(BIN)/python benchmarks/storage.py

# A 2-rank CPU job (DDP, FSDP2) watched vs unwatched, alone.
bench-distributed: setup-test
	$(BIN)/python benchmarks/distributed.py

# How large a job one server takes (docs/distributed.md): simulated ranks against one server, at
# the targets' sizes; another size with e.g. RANKS_ARGS="--ranks 8,32,64 --steps 60".
RANKS_ARGS ?=
bench-ranks: setup-test
ifeq ($(strip $(RANKS_ARGS)),)
	$(BIN)/python benchmarks/ranks.py --ranks 1024 --tensors 700 --period 1 --steps 300
	$(BIN)/python benchmarks/ranks.py --ranks 256 --tensors 700 --period 0.2 --steps 300
else
	$(BIN)/python benchmarks/ranks.py $(RANKS_ARGS)
endif

# Storage at scale alone: ingest (SQLite, PostgreSQL, MLflow), reads, export, disk, run management.
bench-storage: setup-test $(BENCH_VENV)/.stamp
	$(BIN)/python benchmarks/storage.py

# The dashboard's speed alone, in real Chromium: a 1,000-tensor x 10,000-step run and a live one.
bench-dashboard: setup-test
	$(BIN)/python benchmarks/dashboard.py

# Two commits side by side, interleaved (docs/benchmarks.md): the tool for any change to a hot path.
#   make bench-compare BASE=48517db [HEAD=commit] [ARGS="--rounds 5 --parts storage"]
bench-compare: $(VENV)/.stamp-deps
	@test -n "$(BASE)" || { echo "make bench-compare BASE=commit [HEAD=commit]: BASE is missing"; exit 2; }
	$(BIN)/python benchmarks/compare.py $(BASE) $(HEAD) $(ARGS)

clean:
	rm -rf $(VENV) $(BENCH_VENV) build dist */build */*.egg-info vendor/node_modules frontend/vendor

# The CUDA path on a lent GPU machine: `make gpu-wheels` here (PyPI reachable) fills
# .whl/ with our wheels and what the GPU image lacks; scripts/gpu-check.sh runs there (tests marked
# `cuda`, then benchmarks/gpu.py). Here it is a dry run: the tests skip, the benchmark says why.
.PHONY: gpu-wheels gpu-check-dry-run
gpu-wheels: setup $(VENV)/.stamp-test-deps
	./scripts/gpu-wheels.sh

gpu-check-dry-run: setup $(VENV)/.stamp-test-deps
	GPU_WHEELS=none PYTHON=$(BIN)/python OUT=$(CURDIR)/gpu-out ./scripts/gpu-check.sh --quick
