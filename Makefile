# Two commands do all the set-up: `make quickstart` (the main job) and `make test` (the whole suite).
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
# test processes at once (pytest-xdist; each test module stays in one process, its engines and fixtures in
# order). One: the notebook suite runs two notebooks at once, each engine bound to a core of its own; with
# a second test process beside it (three engines on two cores) CI stalled past its 90-minute limit
TEST_WORKERS ?= 1

.PHONY: setup quickstart test unit lab bench
setup:
	./scripts/setup-env

quickstart: setup
	$(VENV)/bin/labkit run notebooks/00_quickstart.ipynb $(ARGS)

test: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope $(ARGS)

unit: setup
	$(PY) -m pytest tests/unit $(ARGS)

# labkit lab: the project's root with evidence read-only, --allow-root for root (containers run as root)
lab: setup
	$(VENV)/bin/labkit lab

bench: setup
	$(PY) benchmarks/harness_tax.py $(ARGS)
