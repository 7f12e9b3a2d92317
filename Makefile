# Every target bootstraps its own virtual environment in .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-fx-sanity check fuzz bench bench-export bench-program clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-cache-dir --upgrade pip
	# torch first, pinned, so nothing else can pull another build.
	$(PY) -m pip install --quiet --no-cache-dir "torch==2.13.0"
	$(PY) -m pip install --quiet --no-cache-dir -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m exportir.demo

# `make test` stays under 10 minutes on 2 cores; tests marked `slow` (heavier suites: whole-corpus
# interop round trips, long generation runs, the browser test) run in `make test-slow`, and CI
# (`.ci/run`, `make check`) runs both.
# --dist loadgroup: tests of one model share its per-process caches (tests/conftest.py)
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not slow" tests

# pytest's status 5 means "no test selected": not a failure while no suite is marked slow.
test-slow: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup -m slow tests || test $$? -eq 5

# The FX parity tests with torch.fx standing in for exportir.fx (tests/conftest.py): torch against
# itself must pass every one, so a failure in `make test` is ours, not the harness's.
test-fx-sanity: $(STAMP)
	EXPORTIR_FX_IMPL=torch.fx $(PY) -m pytest -q -n 2 -m "not slow" tests/fx

check: test test-slow test-fx-sanity

bench: $(STAMP)
	$(PY) benchmarks/fx_bench.py

bench-export: $(STAMP)
	$(PY) benchmarks/export_bench.py

# The ExecuTorch anchor lives in its own venv so it can never touch the project's environment.
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed

$(BENCH_STAMP): pyproject.toml
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet "torch==2.13.0"
	$(BENCH_VENV)/bin/pip install --quiet "executorch==1.5.1" "torch==2.13.0"
	$(BENCH_VENV)/bin/pip install --quiet --no-deps -e .
	$(BENCH_VENV)/bin/pip install --quiet sympy pyyaml numpy isal
	$(BENCH_VENV)/bin/python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 'torch changed: ' + torch.__version__)"
	touch $(BENCH_STAMP)

bench-program: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python benchmarks/program_bench.py

clean:
	rm -rf $(VENV) $(BENCH_VENV)

# A longer run of the fuzz suite (tests/fuzz): EXPORTIR_FUZZ_CASES mutants per file kind from a
# seed of its own (FUZZ_SEED=... to reproduce one); `make test` runs a fixed seed and a few.
FUZZ_CASES ?= 5000
FUZZ_SEED ?= $(shell date +%s)

fuzz: $(STAMP)
	EXPORTIR_FUZZ_CASES=$(FUZZ_CASES) EXPORTIR_FUZZ_SEED=$(FUZZ_SEED) $(PY) -m pytest -q -p no:xdist -s tests/fuzz
