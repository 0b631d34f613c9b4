# Two entry points: `make train` and `make test`. Both create .venv on first use and install
# jaxmnist-onednn into it where a C++ compiler is found.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: train test test-accelerator lint bench docs docs-images clean

PIP := $(BIN)/pip
$(PIP):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(STAMP): $(PIP) pyproject.toml
	$(PIP) install --quiet -e '.[test]'
	touch $(STAMP)

# jaxmnist-onednn (native/): oneDNN's CPU convolution as XLA FFI handlers, compiled by pip
# into a wheel, against JAX's headers and Intel's oneDNN wheels, in pip's isolated build
# environment: apart from .venv, so that `make -j` builds it while the test extra installs
# (.ci/run does); the wheel is then installed into .venv (forced: a rebuilt wheel keeps
# its version). Where a C++ compiler is found (the one setuptools uses: $CXX, else
# Python's own build's) a failed build stops make: a fault to fix, not a fallback.
# Without one, jaxmnist runs its convolutions with im2col; this says so each time, and
# builds it once a compiler is there.
WHEELS := $(VENV)/wheels
NATIVE_WHEEL := $(WHEELS)/.onednn
NATIVE := $(VENV)/.onednn
HAS_CXX := import os, shlex, shutil, sysconfig; \
  cxx = os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++"; \
  raise SystemExit(shutil.which(shlex.split(cxx)[0]) is None)
$(NATIVE_WHEEL): $(PIP) $(wildcard native/*.toml native/*.py native/src/* native/jaxmnist_onednn/*.py)
	@if $(BIN)/python -c '$(HAS_CXX)'; then \
	  rm -f $(WHEELS)/jaxmnist_onednn-*.whl; \
	  echo "$(PIP) wheel ./native"; \
	  $(PIP) wheel --quiet --no-deps --wheel-dir $(WHEELS) ./native && touch $@; \
	else \
	  echo "no C++ compiler: jaxmnist-onednn not built; CNNs on the CPU use im2col"; \
	fi
$(NATIVE): $(STAMP) $(NATIVE_WHEEL)
	@if [ -f $(NATIVE_WHEEL) ]; then \
	  echo "$(PIP) install $(WHEELS)/jaxmnist_onednn-*.whl"; \
	  $(PIP) install --quiet --force-reinstall $(WHEELS)/jaxmnist_onednn-*.whl && touch $@; \
	fi

train: $(STAMP) $(NATIVE)
	$(BIN)/jaxmnist train --preset tpu101

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Test processes: one per core, at most 4. XLA compiles on one thread, so a process per
# core keeps every core busy. One more, to fill the time tests wait on a child process (a
# CLI run, a killed trainer, a server), made the suite slower on two cores: it is bound by
# them, and the extra process added more CPU time than the waits left idle. Each process
# also holds its own JAX runtime, hence the cap.
# The multi-device tests need 8 fake CPU devices, which must be set before JAX starts.
# They start several training processes each and time how soon one notices another's
# loss: one test process per core too.
# Each step lists its 25 longest tests (--durations), to see where the time goes.
# The main suite compiles with XLA's classic CPU emitters (TEST_XLA_FLAGS): its programs
# are many and small, compiling them is most of its time, and the classic emitters compile
# them sooner. They train the same models bit for bit (tests/test_compile_setting.py
# checks it). The multi-device suite keeps XLA's default emitters, those a CPU run uses.
TEST_XLA_FLAGS := --xla_cpu_use_fusion_emitters=false
CORES := $(shell $(PYTHON) -c 'import os; print(len(getattr(os, "sched_getaffinity", lambda _: range(os.cpu_count() or 1))(0)))')
PYTEST := $(BIN)/python -m pytest -q
test: lint $(NATIVE)
	XLA_FLAGS=$(TEST_XLA_FLAGS) $(PYTEST) -n $$(( $(CORES) < 4 ? $(CORES) : 4 )) --durations=25
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(PYTEST) -n $$(( $(CORES) < 4 ? $(CORES) : 4 )) --durations=25 tests/multidevice

# The accelerator lane: the tests marked `accelerator`, in one process (a TPU admits one
# program at a time), on whatever JAX picks (the chip on a TPU VM; the CPU elsewhere).
test-accelerator: $(STAMP)
	$(PYTEST) -m accelerator -p no:xdist --durations=10

# The documentation site, into site/: MkDocs with the Material theme (the `docs` extra), in
# strict mode, so a warning, a broken link or anchor, or a page missing from the nav fails
# the build (not `--quiet`, which hides warnings from the count strict mode fails on). The
# reference pages are written from the code at each build (docs/hooks/).
DOCS := $(VENV)/.docs
$(DOCS): $(STAMP)
	$(BIN)/pip install --quiet -e '.[docs]'
	touch $@

docs: $(DOCS)
	$(BIN)/mkdocs build --strict

# The docs' pictures of the report, compare, search and serve pages: real runs on MNIST,
# photographed by headless Chromium (docs/screenshots.py). Not part of `docs`: it trains.
docs-images: $(STAMP)
	$(BIN)/python docs/screenshots.py

bench: $(STAMP)
	$(BIN)/python benchmarks/epoch_vs_tutorial.py

clean:
	rm -rf $(VENV) runs site native/build native/*.egg-info
