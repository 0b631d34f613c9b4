# Two entry points: `make train` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: train test test-accelerator lint bench clean

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

# Test processes: one more than the cores, at most 4. XLA compiles on one thread, so
# a process per core keeps every core busy, and many tests spend part of their time
# waiting on a child process (a CLI run, a killed trainer, a server), which one more
# process fills; each process also holds its own JAX runtime, hence the cap.
# The multi-device tests need 8 fake CPU devices, which must be set before JAX starts.
# They start several training processes each and time how soon one notices another's
# loss, so they keep one test process per core.
# Each step lists its 25 longest tests (--durations), to see where the time goes.
CORES := $(shell $(PYTHON) -c 'import os; print(len(getattr(os, "sched_getaffinity", lambda _: range(os.cpu_count() or 1))(0)))')
PYTEST := $(BIN)/python -m pytest -q
test: lint
	$(PYTEST) -n $$(( $(CORES) + 1 < 4 ? $(CORES) + 1 : 4 )) --durations=25
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(PYTEST) -n $$(( $(CORES) < 4 ? $(CORES) : 4 )) --durations=25 tests/multidevice

# The accelerator lane: the tests marked `accelerator`, in one process (a TPU admits one
# program at a time), on whatever JAX picks (the chip on a TPU VM; the CPU elsewhere).
test-accelerator: $(STAMP)
	$(PYTEST) -m accelerator -p no:xdist --durations=10

bench: $(STAMP)
	$(BIN)/python benchmarks/epoch_vs_tutorial.py

clean:
	rm -rf $(VENV) runs
