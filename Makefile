# The two commands: `make run` (whole pipeline on embedded defaults) and `make test`.
# Both create .venv/ and install the project into it when missing or stale.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.trainflow-installed
ARGS ?=
PYTEST_ARGS ?=

# Telemetry off for every tool: nothing may wait on the network.
export DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export GX_ANALYTICS_ENABLED := false
export DVC_NO_ANALYTICS := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: run test test-suite test-image install data unit slurm-deps docs docs-serve clean-state lock check-lock team-up team-down image image-cpu image-run

install: $(STAMP)

# A first install takes minutes (torch alone is ~200 MB), so each phase says what it does. On a
# terminal pip also shows its own progress (each package, download bars); elsewhere (CI logs) it
# is quiet and only the phase lines appear.
PIP_QUIET = $$(test -t 1 || echo -q)

# The dev and team extras (test tools, MLflow's auth app) come from the hash-pinned dev lock.
# --no-compile: pip would compile every module of every package (~21,000 files, over a minute on
# one core); Python compiles each one the first time it is imported instead, and keeps it in
# __pycache__ (a few thousand modules, about 20 s of CPU once). So Python must be let write them:
# PYTHONDONTWRITEBYTECODE is not passed on (with it set, every process would compile its imports).
unexport PYTHONDONTWRITEBYTECODE

# trainflow's dependencies install at the versions requirements/lock.txt pins (its hashes dropped,
# so that pip may take torch's CPU build where that is what this host offers, and the CUDA build
# elsewhere): a release published after the lock cannot change what the suite runs against.
CONSTRAINTS := $(VENV)/lock-constraints.txt

$(STAMP): pyproject.toml requirements/lock.txt requirements/lock-dev.txt
	@test -x $(PY) || { echo "trainflow: [1/4] creating $(VENV)/ (first run only)"; $(PYTHON) -m venv $(VENV); }
	@echo "trainflow: [2/4] installing trainflow and its dependencies into $(VENV)/ (torch, Prefect, MLflow, DVC, GX: a few minutes the first time)"
	@sed -e '/^ *--hash/d' -e 's/ *\\$$//' requirements/lock.txt > $(CONSTRAINTS)
	@$(PY) -m pip install $(PIP_QUIET) --no-compile -c $(CONSTRAINTS) -e .
	@echo "trainflow: [3/4] installing the dev and test tools (hash-pinned requirements/lock-dev.txt)"
	@$(PY) -m pip install $(PIP_QUIET) --no-compile --require-hashes --no-deps -r requirements/lock-dev.txt
	@echo "trainflow: [4/4] checking that the installed packages fit together (pip check)"
	@$(PY) -m pip check
	@touch $(STAMP)

# The bundled dataset comes from the DVC remote inside the repository (offline). Its .dvc files
# name that remote themselves (remote: bundled), and there is no default remote on purpose (a
# user's `dvc push` of their own data must not land in dvc-store/), so DVC prints "No remote
# provided and no default remote set." on every pull: that one line is dropped. Not -q: it hides
# DVC's errors too (a failed pull said only that line). Its summary (stdout) goes; its warnings,
# errors (stderr) and exit status come through.
DVC_NO_DEFAULT_REMOTE := No remote provided and no default remote set.
data: $(STAMP)
	@set -o pipefail; $(VENV)/bin/dvc pull 2>&1 >/dev/null | { grep -vxF "$(DVC_NO_DEFAULT_REMOTE)" || true; } >&2

run: data
	$(VENV)/bin/trainflow run $(ARGS)

# The suite runs in TEST_PROCS processes (pytest-xdist), a test file per process at a time: a
# module's fixtures (a first pipeline run, a server) run once. TEST_PROCS=0 runs it in this one.
# With IMAGE_TEST=1 (the default) the suite includes the image test: its build (scripts/image.py
# alongside: podman set up where it can be, the CPU image built) runs beside the install and the
# suite from the start, so its minutes overlap them instead of following them, and the image test
# runs last and uses it. Where no engine can be had (not Debian, not root, no apt) the image test
# skips, saying why. IMAGE_TEST=0 leaves the build out and the image test skips.
# Three processes on two cores: the integration tests spend much of their time starting processes
# and servers and waiting on their events (a fresh clone's suite used about 1.2 cores on average with
# two), so a third keeps both cores busy.
TEST_PROCS ?= 3
IMAGE_TEST ?= 1

test:
ifeq ($(IMAGE_TEST),1)
	@$(PYTHON) scripts/image.py alongside -- $(MAKE) --no-print-directory test-suite
else
	@$(MAKE) --no-print-directory test-suite
endif

test-suite: data slurm-deps
	$(PY) -m pytest -n $(TEST_PROCS) --dist loadfile $(PYTEST_ARGS)

# The Slurm tests (tests/integration/test_slurm.py) start a real two-node Slurm on loopback from
# Debian's slurm-wlm and munge, and its REST API from slurmrestd. Run as root with apt-get (CI),
# `make test` installs them when missing; elsewhere those tests skip, and this says how to enable them.
SLURM_PROGRAMS := sbatch squeue scontrol scancel sinfo slurmctld slurmd munged slurmrestd
SLURM_APT := DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge slurmrestd
slurm-deps:
	@missing=; for p in $(SLURM_PROGRAMS); do PATH="$$PATH:/usr/sbin:/sbin" command -v $$p >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "trainflow: installing slurm-wlm, munge and slurmrestd for the Slurm tests (apt-get)"; \
	    $(SLURM_APT) >/dev/null || { apt-get update -q >/dev/null && $(SLURM_APT) >/dev/null; } \
	      || echo "trainflow: slurm-wlm, munge and slurmrestd did not install: the Slurm tests skip"; \
	  else echo "trainflow: the Slurm tests skip: apt-get install -y slurm-wlm munge slurmrestd (as root) enables them"; fi; \
	fi

# The image test alone, building here (layers cached after the first build: about a minute).
test-image: data
	TRAINFLOW_IMAGE_TEST=1 $(PY) -m pytest -m image $(PYTEST_ARGS)

unit: data
	$(PY) -m pytest tests/unit -q

# The documentation site (mkdocs.yml, docs/) into build/site/. --strict: a broken link or anchor, or a
# page left out of the nav, fails it (tests/unit/test_docs.py builds it the same way in `make test`).
# docs/configuration.md is generated: `$(PY) scripts/config_reference.py` after editing core/config.py.
DOCS_ENV := NO_MKDOCS_2_WARNING=1

docs: $(STAMP)
	$(DOCS_ENV) $(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	$(DOCS_ENV) $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

# Forget every run, model and Prefect record of the embedded defaults.
clean-state:
	@if [ -f $(TEAM_DIR)/team.json ]; then echo "team mode is up: make team-down first" >&2; exit 1; fi
	rm -rf .trainflow

# Hash-pinned lock files (requirements/lock.txt: CUDA torch, lock-cpu.txt: CPU torch, lock-dev.txt:
# the dev/team extras on top) from pyproject.toml; needs the package index. `check-lock` is offline
# and fails when they drift.
lock: $(STAMP)
	$(PY) -m pip install -q 'pip>=25.1,<27'
	$(PY) scripts/lock.py

check-lock: $(STAMP)
	$(PY) scripts/check_lock.py

# Team mode: PostgreSQL + `mlflow server` (served artifacts, basic auth) + `prefect server` (auth
# string), all on 127.0.0.1 and behind passwords, state and 0600 secrets in $(TEAM_DIR).
# `eval "$$(make -s team-up)"` sets the two URLs and sources $(TEAM_DIR)/env.sh for the credentials.
TEAM_DIR ?= .trainflow/team
TEAM_ARGS ?=

team-up: $(STAMP)
	@$(PY) scripts/team.py up --dir $(TEAM_DIR) $(TEAM_ARGS)

team-down:
	@$(PY) scripts/team.py down --dir $(TEAM_DIR)

# The container image from docker/Dockerfile, with docker or podman (scripts/image.py: standard library
# only, no venv). image-cpu builds anywhere scripts/image.py can get an engine: with no registry
# reachable it makes a Debian bookworm base first (mmdebstrap; installs podman on a Debian host as
# root). image (CUDA) needs the CUDA base's registry. image-run runs the built CPU image offline
# with its digest recorded; TRAINFLOW_HOME goes to IMAGE_HOME on the host.
IMAGE_HOME ?= .trainflow/image-home

image-cpu:
	@$(PYTHON) scripts/image.py build --variant cpu

image:
	@$(PYTHON) scripts/image.py build --variant cuda

image-run:
	@$(PYTHON) scripts/image.py run --home $(IMAGE_HOME) $(ARGS)
