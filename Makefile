# Two commands do all the set-up: `make quickstart` (the main job) and `make test` (the whole suite).
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: setup quickstart test unit lab bench
setup:
	./scripts/setup-env

quickstart: setup
	$(VENV)/bin/labkit run notebooks/00_quickstart.ipynb $(ARGS)

test: setup
	$(PY) -m pytest $(ARGS)

unit: setup
	$(PY) -m pytest tests/unit $(ARGS)

# labkit lab: the project's root with evidence read-only, --allow-root for root (containers run as root)
lab: setup
	$(VENV)/bin/labkit lab

bench: setup
	$(PY) benchmarks/harness_tax.py $(ARGS)
