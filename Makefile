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

# JupyterLab refuses root unless told (containers run as root); it prints the lab's address when it starts
lab: setup
	@echo "JupyterLab on notebooks/: open the http://127.0.0.1:8888/lab?token=... address it prints below"
	$(VENV)/bin/jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root,)

bench: setup
	$(PY) benchmarks/harness_tax.py $(ARGS)
