# Two commands do all the set-up: `make quickstart` (the main job) and `make test` (the whole suite).
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
# test processes at once (pytest-xdist): engine starts are mostly one core importing vLLM, so two keep a
# 2-core machine busy; each test module stays in one process (its engines and fixtures in order)
TEST_WORKERS ?= 2

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
