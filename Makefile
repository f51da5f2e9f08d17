# Two commands do everything from a clean clone: `make lab` and `make test`.
# Each creates .venv and installs what it needs on first use.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

# On a machine without an NVIDIA GPU, install the CPU build of torch: the "+cpu" local version
# can only be satisfied by a CPU wheel, so the multi-GB CUDA build is never downloaded.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(HAS_GPU),yes)
TORCH_SPEC ?= torch
else
TORCH_SPEC ?= torch==2.13.0+cpu
endif

LAB_PORT ?= 8888
LAB_ARGS ?=

.PHONY: lab test test-fast bench clean

$(VENV)/.installed-test: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -qq --upgrade pip
	$(PIP) install -qq "$(TORCH_SPEC)"
	$(PIP) install -qq -e ".[test]"
	touch $@

lab: $(VENV)/.installed-test
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --port=$(LAB_PORT) --no-browser $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

test: $(VENV)/.installed-test
	$(PY) -m pytest -q -ra

test-fast: $(VENV)/.installed-test
	$(PY) -m pytest -q -ra -m "not slow"

bench: $(VENV)/.installed-test
	$(PY) benchmarks/bench_plan.py
	$(PY) benchmarks/bench_cluster.py
	$(PY) benchmarks/bench_run.py --quick
	$(PY) benchmarks/gpu_gpt2.py

clean:
	rm -rf $(VENV) build dist artifacts .pytest_cache
