# Two entry points: `make train` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: train test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/jaxmnist train --preset tpu101

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Test processes: one per core, at most 4. XLA compiles on one thread, so a second
# process keeps a second core busy (1.4x as fast a run on 2 cores); each process also
# holds its own JAX runtime, hence the cap.
# The multi-device tests need 8 fake CPU devices, which must be set before JAX starts.
PYTEST := $(BIN)/python -m pytest -q -n auto --maxprocesses 4
test: lint
	$(PYTEST)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(PYTEST) tests/multidevice

bench: $(STAMP)
	$(BIN)/python benchmarks/epoch_vs_tutorial.py

clean:
	rm -rf $(VENV) runs
