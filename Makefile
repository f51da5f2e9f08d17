# Two commands do everything from a clean clone: `make lab` and `make test`.
# Each creates .venv and installs what it needs on first use.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

# Which torch: tests/torch_choice.py picks the build for this machine and says which, and from
# where — on a machine without an NVIDIA GPU the CPU build (from the wheels pip is configured with,
# else PyTorch's CPU index), else the public index's; TORCH_SPEC=… installs what you name instead.
TORCH_SPEC ?=
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

LAB_PORT ?= 8888
LAB_ARGS ?=

# Browser tests drive a real JupyterLab with Debian's Chromium (never `playwright install`: its CDN
# is out of reach). They run as a pytest command of their own: Playwright's sync API and the
# asyncio-based tests of the main suite do not share a process well.
CHROMIUM ?= /usr/bin/chromium
export CHROMIUM
PYTEST_MAIN := $(PY) -m pytest -q -ra --durations=12 --ignore=tests/browser --ignore=tests/slurm --ignore=tests/docs
PYTEST_BROWSER := $(PY) -m pytest -q -ra --durations=6 -p no:cacheprovider tests/browser
PYTEST_LAB := $(PY) -m pytest -q -ra --durations=6 -p no:cacheprovider tests/lab
PYTEST_SLURM := $(PY) -m pytest -q -ra --durations=6 -p no:cacheprovider tests/slurm
# the quickstart notebook, executed for the site's tutorial: in make test's second stream, before the
# site is built (the rest of tests/test_notebooks.py runs in the main suite)
TUTORIAL_TEST := tests/test_notebooks.py::test_quickstart_notebook
PYTEST_TUTORIAL := $(PY) -m pytest -q -ra --durations=3 -p no:cacheprovider $(TUTORIAL_TEST)

.PHONY: lab labextension labextension-build lint test test-fast test-browser chromium sshd prometheus bench clean docs

# The JupyterLab front end (labextension/, TypeScript) is built from source with npm into
# gpugeek_jupyter/labextension/, which the wheel ships prebuilt: installing needs no node.
NPM ?= npm
LABEXT_SOURCES := $(shell find labextension/src labextension/style labextension/schema -type f 2>/dev/null) \
	labextension/package.json labextension/package-lock.json labextension/tsconfig.json

# Order matters: jupyterlab first (the extension build runs `jupyter labextension build`), then the
# front end, then this package (its npm hook skipped: the front end is built), which copies the
# built extension and the server extension's switch into the venv. A change under labextension/
# redoes these steps.
# The installs go through uv (pip's resolver, with downloads and installs in parallel: ~20 s where
# pip took ~150 s), from the sources pip is configured with (tests/uv_sources.py). Compiled to
# bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set, a process would otherwise compile
# every module it imports (torch's, Ray's) again, every time.
UV := $(VENV)/bin/uv
$(VENV)/.installed: pyproject.toml $(LABEXT_SOURCES)
	cd labextension && $(NPM) ci --no-audit --no-fund --loglevel=error > .npm-ci.log 2>&1 & npm=$$!; \
	  { test -x $(PY) || { $(PYTHON) tests/test_minors.py --fits && $(PYTHON) -m venv $(VENV); }; } && \
	  $(PIP) install -qq --upgrade pip uv && \
	  sources=$$($(PY) tests/uv_sources.py) && \
	  torch=$$($(PY) tests/torch_choice.py --record --spec "$(TORCH_SPEC)" --cpu-index "$(TORCH_CPU_INDEX)" $$sources) && \
	  eval "set -- $$torch" && \
	  $(UV) pip install -q --compile-bytecode --python $(PY) $$sources "$$@" \
	    "jupyterlab>=4.6,<5" "hatchling>=1.21" "hatch-jupyter-builder>=0.9" editables; \
	  venv=$$?; wait $$npm; npm_rc=$$?; cat labextension/.npm-ci.log; rm -f labextension/.npm-ci.log; \
	  test $$venv -eq 0 && test $$npm_rc -eq 0
	$(MAKE) --no-print-directory labextension-build
	SKIP_JUPYTER_BUILDER=1 $(UV) pip install -q --compile-bytecode --python $(PY) $$($(PY) tests/uv_sources.py) \
	  --no-build-isolation -e .
	@$(PY) tests/torch_choice.py --installed
	touch $@

# the tests' and the docs' packages besides (make test, make docs)
$(VENV)/.installed-test: $(VENV)/.installed
	SKIP_JUPYTER_BUILDER=1 $(UV) pip install -q --compile-bytecode --python $(PY) $$($(PY) tests/uv_sources.py) \
	  --no-build-isolation -e ".[test,docs]"
	touch $@

# `npm ci` installs exactly the committed package-lock.json
labextension:
	cd labextension && $(NPM) ci --no-audit --no-fund --loglevel=error
	$(MAKE) --no-print-directory labextension-build

# (the venv's install runs `npm ci` beside its own, then this)
labextension-build:
	cd labextension && PATH="$(abspath $(VENV))/bin:$$PATH" $(NPM) run --silent build:prod

# The documentation site (docs/, Sphinx + MyST) into site/, offline: no fetch at build or read time.
# Strict: any warning fails it. The notebooks' pages show the outputs tests/test_notebooks.py kept in
# artifacts/notebooks/ (never run here); DOCS_NOTEBOOKS=required (as make test builds) makes a missing
# or stale one a failure. Then tests/docs/ checks the built pages (nothing loaded over http(s)).
DOCS_NOTEBOOKS ?=
# (built under build/, then moved: myst-nb writes a jupyter_execute/ folder beside the output folder)
docs: $(VENV)/.installed-test
	rm -rf site build/site
	GPUGEEK_DOCS_NOTEBOOKS=$(DOCS_NOTEBOOKS) $(VENV)/bin/sphinx-build -E -W --keep-going -b html \
	  -d build/doctrees docs build/site
	mv build/site site
	GPUGEEK_DOCS_NOTEBOOKS=$(DOCS_NOTEBOOKS) $(PY) -m pytest -q -p no:cacheprovider tests/docs

# JupyterLab on the quickstart notebook, opened in your browser (where this machine has none, open
# the URL it prints); ^C stops it
lab: $(VENV)/.installed
	$(VENV)/bin/jupyter lab --port=$(LAB_PORT) $(if $(filter 0,$(shell id -u)),--allow-root) \
	  --LabApp.default_url=/lab/tree/notebooks/quickstart.ipynb $(LAB_ARGS)

# The house checks, before any suite: ruff over the Python; vermin, which refuses in the package
# what is newer than the oldest Python it supports (requires-python; hosts run that code on their
# own Python: tests/test_minors.py also imports it under each supported minor); and the TypeScript
# compiler's strict check over the front end (tsconfig.json has "strict": true).
lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/vermin --no-tips --violations -q --target=$$($(PY) tests/test_minors.py --oldest)- gpugeek_jupyter
	cd labextension && node_modules/.bin/tsc --noEmit -p .

# Lint first; then every suite runs, and `make test` fails if any of them does. Two streams run at
# once, of about equal length here: the main suite, its example notebooks first; and beside it the
# lab's files (lab-files, below), the multi-host lab (tests/lab), the browser suite, the Slurm lab
# (tests/slurm: its hosts install from the lab's files), the quickstart notebook and then the
# documentation site (make docs, strict, once the main suite has kept the executed notebooks it
# renders: it builds while the main suite goes on), into artifacts/test-*.log (printed when they end).
# Much of each stream's time is waiting — idle windows, budgets, SSH, page loads — so on two cores
# they overlap (MAKE_TEST_SERIAL=1: one after another, as `test-fast` and friends always run).
test: test-setup lint chromium sshd prometheus
	@mkdir -p artifacts; rm -f artifacts/test-*.log artifacts/test-*.rc; \
	began=$$(date +%s); ended() { echo "$$1: ended $$(( $$(date +%s) - began )) s after the suites began" \
	  >> artifacts/test-times.log; }; \
	if [ -n "$(MAKE_TEST_SERIAL)" ]; then \
	  $(MAKE) --no-print-directory lab-files && $(PYTEST_MAIN); main=$$?; $(PYTEST_SLURM); slurm=$$?; \
	  $(PYTEST_BROWSER); browser=$$?; lab=0; $(MAKE) --no-print-directory docs DOCS_NOTEBOOKS=required; docs=$$?; \
	else \
	  rm -f artifacts/test-times.log; \
	  ( { $(MAKE) --no-print-directory lab-files && ended "the lab's files" && $(PYTEST_LAB); } \
	      > artifacts/test-lab.log 2>&1; echo $$? > artifacts/test-lab.rc; ended "tests/lab"; \
	    $(PYTEST_BROWSER) > artifacts/test-browser.log 2>&1; echo $$? > artifacts/test-browser.rc; ended "tests/browser"; \
	    { test -e .cache/lab-image/bin/python3 || $(MAKE) --no-print-directory lab-files; } > artifacts/test-slurm.log 2>&1; \
	    $(PYTEST_SLURM) >> artifacts/test-slurm.log 2>&1; echo $$? > artifacts/test-slurm.rc; ended "tests/slurm"; \
	    { $(PYTEST_TUTORIAL); tutorial=$$?; ended "the tutorial notebook"; \
	      while [ ! -e artifacts/test-notebooks.rc ]; do sleep 5; done; \
	      $(MAKE) --no-print-directory docs DOCS_NOTEBOOKS=required && test $$tutorial -eq 0; } \
	      > artifacts/test-docs.log 2>&1; echo $$? > artifacts/test-docs.rc; ended "make docs" ) & \
	  $(PYTEST_MAIN) tests/test_notebooks.py --deselect $(TUTORIAL_TEST); notebooks=$$?; \
	  echo $$notebooks > artifacts/test-notebooks.rc; ended "the example notebooks (main suite)"; \
	  $(PYTEST_MAIN) --ignore=tests/lab --ignore=tests/test_notebooks.py; main=$$?; \
	  test $$notebooks -eq 0 || main=$$notebooks; echo $$main > artifacts/test-main.rc; ended "the main suite"; \
	  wait; echo "== when each part ended"; cat artifacts/test-times.log; echo "== tests/lab"; cat artifacts/test-lab.log; echo "== tests/browser"; cat artifacts/test-browser.log; \
	  echo "== tests/slurm"; cat artifacts/test-slurm.log; echo "== the tutorial notebook, make docs"; cat artifacts/test-docs.log; \
	  lab=$$(cat artifacts/test-lab.rc); browser=$$(cat artifacts/test-browser.rc); slurm=$$(cat artifacts/test-slurm.rc); \
	  docs=$$(cat artifacts/test-docs.rc); \
	fi; \
	echo "make test: main suite exit $$main, slurm suite exit $$slurm, lab suite exit $$lab, browser suite exit $$browser, docs exit $$docs"; \
	test $$main -eq 0 && test $$slurm -eq 0 && test $$lab -eq 0 && test $$browser -eq 0 && test $$docs -eq 0

# What the suites need, made at once: the Debian packages (one apt-get run for all that are
# missing) beside the venv, the extension build and the package's install.
.PHONY: test-setup system-packages
test-setup:
	@$(MAKE) --no-print-directory -j2 system-packages $(VENV)/.installed-test

# chromium, openssh-server and rsync, prometheus, sudo (the cloud box's images have it), slurm-wlm,
# munge, slurmdbd and mariadb-server (the Slurm lab and its accounting, tests/slurmlab.py: the lab
# starts daemons of its own): the ones missing, in one apt-get run (as root;
# elsewhere the chromium, sshd and prometheus targets below say what to do)
system-packages:
	@missing=""; \
	[ -x "$(CHROMIUM)" ] || missing="$$missing chromium"; \
	[ -x /usr/sbin/sshd ] || missing="$$missing openssh-server"; \
	command -v rsync >/dev/null 2>&1 || missing="$$missing rsync"; \
	command -v sudo >/dev/null 2>&1 || missing="$$missing sudo"; \
	command -v prometheus >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v slurmctld >/dev/null 2>&1 || missing="$$missing slurm-wlm"; \
	command -v munged >/dev/null 2>&1 || missing="$$missing munge"; \
	[ -x /usr/sbin/slurmdbd ] || missing="$$missing slurmdbd"; \
	[ -x /usr/sbin/mariadbd ] || missing="$$missing mariadb-server"; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ]; then \
	  echo "installing$$missing (apt)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; \
	fi

test-fast: $(VENV)/.installed-test
	$(PYTEST_MAIN) -m "not slow"

test-browser: $(VENV)/.installed-test chromium
	$(PYTEST_BROWSER)

# EC2 in a box (tests/cloudbox): moto's EC2 on a lab bridge, a host behind each instance, in the
# foreground till ^C; it prints the exports that point the AWS SDK (and `up --offer aws/…`) at it.
.PHONY: cloudbox
cloudbox: $(VENV)/.installed-test sshd lab-files
	PYTHONPATH=tests $(PY) -m cloudbox

# AWS in a box, the long scenarios (tests/cloudbox; `make test` runs the AWS path end to end, its
# refusals and no credentials), about twelve minutes: the laptop gone from an AWS cluster with a
# budget, the head ending every instance at the cap (tests/lab/test_aws_laptop_gone.py); a spot worker
# taken back mid-job, replaced, the job resumed losing no step, and no spot capacity with
# --spot-fallback (tests/lab/test_aws_spot.py); a head that never answers SSH, and an `up` that crashed
# half-way, downed by its tag (tests/lab/test_aws_in_a_box.py).
.PHONY: cloud-lab
cloud-lab: $(VENV)/.installed-test sshd lab-files
	GPUGEEK_CLOUD_LAB=1 $(PY) -m pytest -q -ra -s -p no:cacheprovider tests/lab/test_aws_laptop_gone.py \
	  tests/lab/test_aws_spot.py \
	  tests/lab/test_aws_in_a_box.py::test_a_head_that_never_answers_ssh_is_given_up_within_the_wait_and_terminated \
	  tests/lab/test_aws_in_a_box.py::test_an_up_that_crashed_half_way_is_listed_and_downed_by_its_tag

# A real Slurm, the long scenarios (tests/slurm; `make test` runs the rest), about thirteen minutes:
# a cell running when its job's walltime comes checkpoints on Slurm's signal, the job ends at its
# walltime, and the next cluster resumes the cell losing no step (tests/slurm/test_slurm_walltime.py);
# with --requeue the job is requeued, runs again on an allocation of its own and the same cell resumes
# there (tests/slurm/test_slurm_requeue.py); the laptop gone with a budget, the head ending the job
# at the cap (tests/slurm/test_slurm_money.py); two clusters sharing both nodes at once
# (test_slurm_cluster.py); a cell on a job the scheduler preempts, checkpointed on the job's signal
# (tests/slurm/test_slurm_preempt.py; SLURM_LAB=long adds its --requeue variant, five minutes more).
SLURM_LAB ?= 1
.PHONY: slurm-lab
slurm-lab: $(VENV)/.installed-test sshd lab-files
	GPUGEEK_SLURM_LAB=$(SLURM_LAB) $(PY) -m pytest -q -ra -s -p no:cacheprovider tests/slurm/test_slurm_walltime.py \
	  tests/slurm/test_slurm_requeue.py tests/slurm/test_slurm_money.py tests/slurm/test_slurm_preempt.py \
	  "tests/slurm/test_slurm_cluster.py::test_two_clusters_on_the_same_nodes_do_not_collide_and_downing_one_leaves_the_other_running"

# The laptop gone, five trials in a row (tests/browser/test_laptop_gone.py, about 3 minutes each;
# .ci/run runs one, LAPTOP_GONE_TRIALS=1; `make test`'s lab takes the head's budget stop on a `ray up`
# cluster): an ssh cluster on the lab, its kernel, watchdog and tunnel killed, the link cut; the
# head stops at the cap, and every reader shows the head's dollars afterwards, and a minute later.
LAPTOP_GONE_TRIALS ?= 5
.PHONY: laptop-gone
laptop-gone: $(VENV)/.installed-test chromium sshd lab-files
	GPUGEEK_LAPTOP_GONE_TRIALS=$(LAPTOP_GONE_TRIALS) $(PY) -m pytest -q -ra -s -p no:cacheprovider \
	  tests/browser/test_laptop_gone.py

# The hosts of a live ssh cluster deleted under it, as a provider's console ends them (tests/lab/
# test_hosts_deleted.py, about two minutes, a lab of its own; .ci/run runs it): the record says when
# it was last heard from, then unreachable, its dollars held; `down --forget` closes it, and nothing
# here dials the deleted addresses afterwards.
.PHONY: hosts-gone
hosts-gone: $(VENV)/.installed-test sshd lab-files
	GPUGEEK_HOSTS_GONE=1 $(PY) -m pytest -q -ra -s -p no:cacheprovider tests/lab/test_hosts_deleted.py

# The lid closed on a running job (tests/lab/test_lid.py, about five minutes): the kernel SIGSTOPped
# and the link cut for 120 s; the job goes on on the hosts and the same cell picks up. Then the
# laptop that never returns (tests/lab/test_never_returns.py, about four): the job ends, the head's
# idle stop ends the cluster one window later. Then the lid closed for 120 s at five moments (during
# up, a group's start, mid-cell, as a cell ends, between cells) and a link cut 20 times during a cell
# (tests/lab/test_lid_moments.py, about twenty minutes).
.PHONY: lid
lid: $(VENV)/.installed-test sshd lab-files
	GPUGEEK_LID=1 $(PY) -m pytest -q -ra -s -p no:cacheprovider tests/lab/test_lid.py tests/lab/test_never_returns.py \
	  tests/lab/test_lid_moments.py

# The training code people already write on three hosts that share nothing (tests/lab/
# test_frameworks_on_hosts.py, about six minutes): the Trainer, Accelerate and Lightning against
# torchrun, and a Trainer that loses a host and resumes from S3; then a Trainer job's live monitor
# in a browser. `make test` runs the frameworks on a local cluster; this builds each host's pip
# environment for the job, a minute of every core, which make test's timed tests do without.
.PHONY: frameworks-lab
frameworks-lab: $(VENV)/.installed-test sshd chromium lab-files
	GPUGEEK_LAB_FRAMEWORKS=1 $(PY) -m pytest -q -ra -s -p no:cacheprovider tests/lab/test_frameworks_on_hosts.py
	GPUGEEK_LAB_FRAMEWORKS=1 $(PY) -m pytest -q -ra -p no:cacheprovider tests/browser/test_framework_monitor_in_lab.py

# A stranger on the lab's bridge tries every port of both hosts of a 2-host ssh cluster, without
# the token (tests/lab/test_stranger.py, about seven minutes; .ci/run runs it after `make test`,
# which tries the keeper's port on a Slurm node in tests/slurm).
.PHONY: stranger
stranger: $(VENV)/.installed-test sshd lab-files
	GPUGEEK_STRANGER_EVERY_HOST=1 $(PY) -m pytest -q -ra -s -p no:cacheprovider tests/lab/test_stranger.py

# The docs' pictures (docs/images/*.png: README.md, docs/how-to/view.md), taken from the real UI by tests/browser/test_screenshots.py:
# a simulated A100 cluster's panel, a live job monitor, the cost dashboard and the Lab sidebar. The
# browser suite skips that module, so only this target rewrites them.
.PHONY: screenshots
screenshots: $(VENV)/.installed-test chromium
	GPUGEEK_SCREENSHOTS=1 $(PY) -m pytest -q -ra -p no:cacheprovider tests/browser/test_screenshots.py

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

# The multi-host lab (tests/lab/, tests/netlab.py) runs an sshd per host: Debian's openssh-server,
# installed when missing (as root; elsewhere those tests skip with the reason), and rsync, with
# which Ray's cluster launcher copies files to the hosts, and sudo (the cloud box's images have it).
sshd:
	@if [ ! -x /usr/sbin/sshd ] || ! command -v rsync >/dev/null 2>&1 || ! command -v sudo >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing openssh-server, rsync and sudo (apt)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends openssh-server rsync sudo >/dev/null || exit 1; \
	  else \
	    echo "no /usr/sbin/sshd and not root: the multi-host lab tests will skip" >&2; \
	  fi; \
	fi

# A real Prometheus scrapes /gpugeek/metrics in tests/test_prometheus.py (Debian's package; no
# daemon is started: the test runs its own, on a free port, and stops it).
prometheus:
	@if ! command -v prometheus >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing prometheus (apt)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends prometheus >/dev/null || exit 1; \
	  else \
	    echo "no prometheus and not root: tests/test_prometheus.py will skip" >&2; \
	  fi; \
	fi

# What the multi-host lab's hosts install from and start with (tests/lab_files.py): a wheel index of
# this kernel's Ray, torch and numpy, served to the hosts on the lab's bridge, and a machine image (a
# Python with torch, no Ray). Made once per set of versions, into .cache/.
.PHONY: lab-files lab-image
lab-files lab-image: $(VENV)/.installed-test
	$(PY) tests/lab_files.py index .cache/lab-index
	$(PY) tests/lab_files.py image .cache/lab-image .cache/lab-index
	@if [ -n "$(OTHER_PYTHON)" ]; then $(PY) tests/lab_files.py kernel .cache/kernel-other $(OTHER_PYTHON); \
	else echo "no Python 3.12 in pyenv: the lab's kernel on another Python skips" >&2; fi

# A kernel newer than its hosts, on the lab (tests/lab/test_python_skew.py: `up`, a DDP cell across
# both hosts, DataFrames both ways, a notebook function pushed, `down`; about a minute once its files
# are made). Its files, two venvs of PyPI's CUDA torch (5.3 and 2.1 GB), take about a minute and a
# quarter from uv's cache, minutes more to download: they are made here only, so make test's streams
# do without that load; make test skips it, .ci/run runs it after.
.PHONY: python-skew
python-skew: $(VENV)/.installed-test sshd lab-files
	@if [ -n "$(NEWER_PYTHON)" ] && [ -n "$(OLDER_PYTHON_HOME)" ]; then \
	  $(PY) tests/lab_files.py kernel .cache/kernel-313 $(NEWER_PYTHON) && \
	  $(PY) tests/lab_files.py host-image .cache/lab-image-310 $(OLDER_PYTHON_HOME); \
	else echo "no Python 3.13 and 3.10 in pyenv: the lab's kernel newer than its hosts skips" >&2; fi
	GPUGEEK_PYTHON_SKEW=1 $(PY) -m pytest -q -ra -s -p no:cacheprovider tests/lab/test_python_skew.py

# A kernel on another Python than the lab hosts' (Debian's python3 is 3.11): pyenv's 3.12, with this
# kernel's Ray, torch, numpy and pandas (tests/lab/test_other_python.py; about 5 GB: torch's CUDA build,
# PyPI's only one for 3.12)
OTHER_PYTHON ?= $(lastword $(sort $(wildcard $(HOME)/.pyenv/versions/3.12.*/bin/python3.12)))
# A kernel newer than its hosts (tests/lab/test_python_skew.py): pyenv's 3.13 with pandas 3, as above,
# driving hosts on a machine image of pyenv's 3.10 with pandas 2.3.3 (a copy of that install with
# PyPI's CUDA torch; the index gets their Ray's cp310 wheels)
NEWER_PYTHON ?= $(lastword $(sort $(wildcard $(HOME)/.pyenv/versions/3.13.*/bin/python3.13)))
OLDER_PYTHON_HOME ?= $(patsubst %/bin/python3.10,%,$(lastword $(sort $(wildcard $(HOME)/.pyenv/versions/3.10.*/bin/python3.10))))

bench: $(VENV)/.installed-test
	$(PY) benchmarks/bench_plan.py
	$(PY) benchmarks/bench_cluster.py
	$(PY) benchmarks/bench_run.py --quick
	$(PY) benchmarks/bench_remote.py
	$(PY) benchmarks/bench_frameworks.py
	$(PY) benchmarks/bench_monitor.py
	$(PY) benchmarks/bench_ticker.py
	$(PY) benchmarks/bench_cli.py
	$(PY) benchmarks/bench_imports.py
	$(PY) benchmarks/gpu_gpt2.py

clean:
	rm -rf $(VENV) build dist artifacts .pytest_cache labextension/node_modules labextension/lib \
	  gpugeek_jupyter/labextension
