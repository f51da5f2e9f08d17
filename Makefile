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

# Browser tests drive a real JupyterLab with Debian's Chromium (never `playwright install`: its CDN
# is out of reach). They run as a pytest command of their own: Playwright's sync API and the
# asyncio-based tests of the main suite do not share a process well.
CHROMIUM ?= /usr/bin/chromium
export CHROMIUM
PYTEST_MAIN := $(PY) -m pytest -q -ra --ignore=tests/browser
PYTEST_BROWSER := $(PY) -m pytest -q -ra -p no:cacheprovider tests/browser

.PHONY: lab test test-fast test-browser chromium bench clean

$(VENV)/.installed-test: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -qq --upgrade pip
	$(PIP) install -qq "$(TORCH_SPEC)"
	$(PIP) install -qq -e ".[test]"
	touch $@

lab: $(VENV)/.installed-test
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --port=$(LAB_PORT) --no-browser $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# Both suites always run; `make test` fails if either does.
test: $(VENV)/.installed-test chromium
	@$(PYTEST_MAIN); main=$$?; \
	$(PYTEST_BROWSER); browser=$$?; \
	echo "make test: main suite exit $$main, browser suite exit $$browser"; \
	test $$main -eq 0 && test $$browser -eq 0

test-fast: $(VENV)/.installed-test
	$(PYTEST_MAIN) -m "not slow"

test-browser: $(VENV)/.installed-test chromium
	$(PYTEST_BROWSER)

# Installs Debian's chromium when it is missing (as root; otherwise says how).
chromium:
	@if [ ! -x "$(CHROMIUM)" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing chromium (apt)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends chromium >/dev/null || exit 1; \
	  else \
	    echo "$(CHROMIUM) is missing; install it with:" \
	      "sudo apt-get update && sudo apt-get install -y --no-install-recommends chromium" >&2; \
	    exit 1; \
	  fi; \
	fi

bench: $(VENV)/.installed-test
	$(PY) benchmarks/bench_plan.py
	$(PY) benchmarks/bench_cluster.py
	$(PY) benchmarks/bench_run.py --quick
	$(PY) benchmarks/bench_monitor.py
	$(PY) benchmarks/gpu_gpt2.py

clean:
	rm -rf $(VENV) build dist artifacts .pytest_cache
