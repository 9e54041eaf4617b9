# gpuprov: the two commands of the Quick start are `make demo` and `make test`.
# Each installs what it needs (virtualenv, Python packages, Docker engine,
# local node image) and then does its job.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export PATH := $(BIN):$(PATH)
export ANSIBLE_NOCOLOR := 1
# When this make began: `make test` reports its whole time, set-up included (tests/suite_budget.py).
SUITE_STARTED := $(shell date +%s)

.PHONY: demo demo-down mirror-build test test-extended lint unit molecule e2e test-driver-move test-debian13 bench host-setup mirror registry settings venv clean node-image-trixie

# The package cache and artifact mirror of this machine (scripts/env.sh).
ENV = eval "$$(scripts/env.sh)" &&

$(STAMP): pyproject.toml scripts/venv.sh
	scripts/venv.sh $(PYTHON) $(VENV)
	touch $@

venv: $(STAMP)

host-setup:
	scripts/host-setup.sh

## node-image-trixie: the Debian 13 node image gpuprov/node:trixie (`up --provider docker --os debian13`),
# built as root with debootstrap when missing or from an older recipe. Not part of host-setup (a
# Debian 12 cluster never needs it): tests/e2e/test_debian13_e2e.py runs this target first.
node-image-trixie:
	@. scripts/lib.sh; have=$$(docker image inspect -f '{{index .Config.Labels "gpuprov.image-recipe"}}' gpuprov/node:trixie 2>/dev/null || true); \
	if [ -n "$$have" ] && [ "$$have" = "$$(recipe_hash)" ]; then echo "node image gpuprov/node:trixie present"; \
	else GPUPROV_NODE_SUITE=trixie scripts/build-node-image.sh gpuprov/node:trixie; fi

# mirror-build starts the build in the background (it needs no Docker), so that it runs beside
# the host's set-up and the first node; mirror serves (a request for an artifact still being
# built is held until it is there).
mirror-build: $(STAMP)
	scripts/artifact-mirror.sh build

mirror: $(STAMP) mirror-build host-setup
	scripts/artifact-mirror.sh

registry: $(STAMP) host-setup
	scripts/registry.sh

# The machine's package cache, artifact mirror and registry as gpuprov's settings file (user
# config dir): a new cluster records them at `up`, from any shell, with nothing exported.
settings: $(STAMP) host-setup mirror registry
	$(ENV) python -c "from gpuprov.settings import write_file; print(f'settings: {write_file()}')"

## demo: two local nodes, bootstrapped and verified (the main job, no GPU, no cost): node 1 from
# scratch, baked, node 2 from its image (one DKMS build; scripts/demo.sh). The mirror builds only
# what the demo's lock needs (cuDNN 8.9); `make test` builds the rest.
demo: export GPUPROV_MIRROR_LINES = default
demo: $(STAMP) mirror-build host-setup mirror registry settings
	$(ENV) scripts/demo.sh demo

demo-down: $(STAMP)
	gpuprov down demo --yes

## test: the whole suite — lint (tests/unit/test_lint.py), unit and CLI tests, molecule scenarios, end to end
# One worker per CPU and one more (at most one per 6 GiB of memory, at least two), each on one unit
# of work at a time (a test file, or one molecule scenario), the longest first (tests/conftest.py),
# so that they end together. Two workers left the two cores idle 15 % of the run (units waiting on
# Slurm, SSH, retries); the third fills it: 27.0 and 25.3 min against 28.2 with two, on the same
# suite (docs/performance-history.md, 2026-12-07), once the grown unit no longer starts before
# its image is near.
TEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; m = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 30; print(max(2, min(len(os.sched_getaffinity(0)) + 1, m // 6)))')
test: $(STAMP) mirror-build host-setup mirror registry settings
	$(ENV) GPUPROV_SUITE_STARTED=$(SUITE_STARTED) python -m pytest tests -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=60

## test-extended: the heavy variants `make test` skips, each with its reason (tests/conftest.py, `extended`)
test-extended: $(STAMP) host-setup mirror registry settings
	$(ENV) GPUPROV_TEST_EXTENDED=1 python -m pytest tests -p no:cacheprovider -m extended -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

## test-driver-move: the whole-stack e2e file with its opt-in real driver move (a second DKMS build)
test-driver-move: $(STAMP) host-setup mirror registry settings
	$(ENV) GPUPROV_E2E_REAL_DRIVER_MOVE=1 python -m pytest tests/e2e/test_docker_cluster.py -p no:cacheprovider

## test-debian13: the opt-in Debian 13 node bootstrapped from scratch (its DKMS build, CUDA 12.4)
test-debian13: $(STAMP) host-setup mirror registry settings
	$(ENV) GPUPROV_E2E_DEBIAN13=1 python -m pytest tests/e2e/test_debian13_e2e.py -p no:cacheprovider

# The linters are one unit of `make test` (tests/unit/test_lint.py: ruff, yamllint, ansible-lint's
# production profile, mypy), run there beside the other units; `make lint` runs that file alone.
lint: $(STAMP)
	python -m pytest tests/unit/test_lint.py -p no:cacheprovider -q

unit: $(STAMP)
	python -m pytest tests/unit tests/cli -p no:cacheprovider

molecule: $(STAMP) host-setup mirror registry
	$(ENV) python -m pytest tests/molecule -p no:cacheprovider

e2e: $(STAMP) host-setup mirror registry settings
	$(ENV) python -m pytest tests/e2e -p no:cacheprovider

## bench: start-up, converge and no-op re-run figures (not a test)
bench: $(STAMP) host-setup mirror registry settings
	$(ENV) python benchmarks/run.py
	$(ENV) python benchmarks/bootstrap_scale.py
	$(ENV) python benchmarks/slurm.py
	$(ENV) python benchmarks/elastic.py
	$(ENV) python benchmarks/pull_s3.py
	$(ENV) python benchmarks/patch_pull.py

clean:
	rm -rf $(VENV) .ruff_cache
