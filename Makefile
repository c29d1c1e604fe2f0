# Two commands do all the set-up: `make quickstart` (the main job) and `make test` (the whole suite).
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
# The tests run in three steps, all of them even when one fails: the notebook suite in one process (it runs
# two notebooks at once, each bound to a core of its own: a test process beside it would put three engines on
# two cores), then the engine and browser tests in TEST_WORKERS processes (pytest-xdist; each on its own share
# of the cores, each test module staying in one), then the unit tests in TEST_WORKERS processes but those marked
# `alone` (they read the host's load, which a second process would move), then those by themselves. ARGS go to
# each step; a step that ARGS leave without tests (exit 5) passes.
TEST_WORKERS ?= 2

.PHONY: setup quickstart test unit unit-steps lab bench
setup:
	./scripts/setup-env

quickstart: setup
	$(VENV)/bin/labkit run notebooks/00_quickstart.ipynb $(ARGS)

test: setup
	@status=0; \
	$(PY) -m pytest tests/notebooks $(ARGS) || [ $$? = 5 ] || status=1; \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope --ignore=tests/notebooks --ignore=tests/unit $(ARGS) || [ $$? = 5 ] || status=1; \
	$(MAKE) --no-print-directory unit-steps || status=1; \
	exit $$status

unit: setup
	$(MAKE) --no-print-directory unit-steps

unit-steps:
	@status=0; \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope -m "not alone" tests/unit $(ARGS) || [ $$? = 5 ] || status=1; \
	$(PY) -m pytest -m alone tests/unit $(ARGS) || [ $$? = 5 ] || status=1; \
	exit $$status

# labkit lab: the project's root with evidence read-only, --allow-root for root (containers run as root)
lab: setup
	$(VENV)/bin/labkit lab

bench: setup
	$(PY) benchmarks/harness_tax.py $(ARGS)
