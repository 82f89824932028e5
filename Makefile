# dra-gpu: the two commands a newcomer needs are `make demo` and `make test`.
# KUBERNETES_VERSION=v1.37.2 runs the local cluster of demo, test, cluster-up (and binaries)
# on another supported release; the default is the one deploy/local/k8sbin/go.mod pins.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The local-cluster tooling (deploy/local/localcluster) is not part of the installed package.
LOCAL := PYTHONPATH=deploy/local
STAMP := $(VENV)/.installed
# setuptools tells how it made an editable install as a warning, which pip prints as a "!!" banner
# in the middle of `make demo`; it is information only (setuptools' InformationOnly), so not shown.
EDITABLE := PYTHONWARNINGS='ignore:Editable installation'

.PHONY: all venv proto binaries cluster-binaries manifests releases release api lint nvml-coverage test test-fast test-changed test-gpu test-matrix test-newest-python fuzz demo cluster-up cluster-down bench bench-pods bench-scale bench-scheduler bench-packing soak clean

all: test

# The virtual environment, with the package installed editable (which also
# generates dra/pb from proto/).
$(STAMP): pyproject.toml setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(EDITABLE) $(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	@# setuptools ignores a failing build step in editable mode: generate again, loudly.
	$(BIN)/python proto/generate.py
	touch $@

venv: $(STAMP)

# Regenerate the gRPC code after editing a .proto file.
proto: $(STAMP)
	$(BIN)/python proto/generate.py

# Build or reuse the Kubernetes binaries and helm (deploy/local/k8sbin, deploy/local/helmbin); the first
# build takes about 8 to 12 minutes on two cores for Kubernetes and 2 to 4 more for helm. demo and cluster-up
# build only what a cluster starts, on first use.
binaries: $(STAMP)
	$(LOCAL) $(BIN)/python -m localcluster build

# Only what a cluster starts. binaries.py needs only the standard library, so the system Python
# runs it: a first `make demo` or `make cluster-up` compiles while pip fills the venv.
cluster-binaries:
	@$(LOCAL) $(PYTHON) -m localcluster.binaries

# Give the chart (deploy/helm/dra-gpu/Chart.yaml) the version of dra/__init__.py, then re-render
# deploy/manifests (kubectl apply -k) from it; a test fails while the committed files differ.
manifests: $(STAMP)
	$(LOCAL) $(BIN)/python -m localcluster.chart manifests

# The releases in this clone's history, newest first: each commit that set a new version in
# dra/__init__.py (docs/releases.md). Only git and the system Python: works on a fresh clone.
releases:
	@$(LOCAL) $(PYTHON) -m localcluster.releases

# From a clean tree at a release: the wheel, the image (OCI tarball) and the packaged chart, each
# named with the version, into dist/<version>/, with the chart's default image checked to be the
# one built. Nothing is uploaded. The image is built as root, like localcluster.driverimage's.
release: $(STAMP)
	$(LOCAL) $(BIN)/python -m localcluster.dist

# the JSON Schemas in api/, generated from dra.api's types (a test fails when they drift)
api: $(STAMP)
	$(BIN)/dra-gpu api-schema --output-dir api

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/shellcheck deploy/kind/*.sh

# The real NVML adapter's tests (over the NVML stand-in where there is no GPU) with its line coverage,
# which must stay at 95 % or more; a few seconds, apart from the suite so that it runs untraced.
NVML_TESTS := tests/unit/test_nvml.py tests/unit/test_nvml_standin.py tests/unit/test_nvml_differential.py \
	tests/unit/test_dynamic_mig_nvml.py tests/unit/test_timeslice.py
nvml-coverage: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider $(NVML_TESTS) --cov=dra.gpu.nvml --cov-report=term-missing \
		--cov-fail-under=95

# pytest in TEST_WORKERS processes (pytest-xdist), in the order tests/conftest.py gives: each file of
# tests/e2e and tests/integration whole on one worker (a cluster test on that worker's own session
# cluster), the largest first; then the other tests one at a time. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 4
PARALLEL := -n $(TEST_WORKERS) --no-loadscope-reorder

# Everything: lint, type checks, unit, integration and end-to-end tests (the NVML adapter's tests
# once, in nvml-coverage).
test: lint nvml-coverage binaries
	$(BIN)/pytest $(PARALLEL) $(addprefix --ignore=,$(NVML_TESTS))

# Only the tests that need no cluster.
test-fast: $(STAMP)
	$(BIN)/pytest $(PARALLEL) -m 'not cluster'

# The tests that cover the files changed since BASE (main), committed or not, by the import graph
# and the files tests read (tests/changed.py, docs/testing.md); CLUSTER=1 runs their cluster tests too.
BASE ?= main
test-changed: $(STAMP)
	$(BIN)/python -m tests.changed --base $(BASE) $(if $(CLUSTER),--cluster) -- $(PARALLEL)

# On a machine with an NVIDIA GPU: the real-GPU checks in one run, written to GPU_OUT (docs/testing.md,
# "On a real GPU"): NVML recorded, discovery, the gpu-marked and MPS tests on the real driver and daemon.
GPU_OUT ?= .gpu-check
test-gpu: $(STAMP)
	OUT=$(GPU_OUT) PATH="$(CURDIR)/$(BIN):$$PATH" bash tests/gpu/check.sh

# Coverage-guided fuzzing (atheris) of every tests/fuzz/fuzz_*.py target, FUZZ_SECONDS each,
# going on from the inputs earlier runs kept in .fuzz/; a finding fails it (docs/testing.md).
# `make test` runs each target for a few seconds.
FUZZ_SECONDS ?= 60
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz.run --seconds $(FUZZ_SECONDS) --keep

# The tests that need no cluster again on the newest Python the image is built for (deploy/Dockerfile's
# PYTHON_VERSION), in a CPython built once from Debian's copy of its source (localcluster.cpython).
NEWEST_PYTHON ?= 3.13.5
NEWEST_VENV := .venv-newest
$(NEWEST_VENV)/.installed-$(NEWEST_PYTHON): pyproject.toml setup.py constraints.txt | $(STAMP)
	@set -e; python="$$($(LOCAL) $(BIN)/python -m localcluster.cpython $(NEWEST_PYTHON))"; \
		rm -rf $(NEWEST_VENV); echo "$$python -m venv $(NEWEST_VENV)"; "$$python" -m venv $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/pip install --quiet --upgrade pip
	$(EDITABLE) $(NEWEST_VENV)/bin/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

# An environment whose interpreter went with the cache is made again.
test-newest-python:
	@$(NEWEST_VENV)/bin/python -c '' 2>/dev/null || rm -f $(NEWEST_VENV)/.installed-$(NEWEST_PYTHON)
	@$(MAKE) --no-print-directory $(NEWEST_VENV)/.installed-$(NEWEST_PYTHON)
	$(NEWEST_VENV)/bin/pytest -p no:cacheprovider $(PARALLEL) -m 'not cluster'

# `make test` on the default release, the tests without a cluster on the newest Python, then the
# cluster tests on each other supported release (docs/testing.md: what runs where and how long).
# The CI's machine is root with containerd buildable: a skip for anything but a GPU or a release the
# test is not for fails it (tests/skips.py; every run prints its skips by reason).
MATRIX_VERSIONS ?= v1.37.2
test-matrix: export DRA_GPU_ALLOWED_SKIPS ?= gpu,release
test-matrix: test
	@$(MAKE) --no-print-directory test-newest-python
	@set -e; for version in $(MATRIX_VERSIONS); do \
		echo "== cluster tests on Kubernetes $$version"; \
		KUBERNETES_VERSION=$$version $(LOCAL) $(BIN)/python -m localcluster build; \
		KUBERNETES_VERSION=$$version $(BIN)/pytest $(PARALLEL) -m cluster; \
	done

# The driver on fake GPUs serving pods on a real local cluster; DEMO_KEEP=1 keeps it up. With
# CONTAINER_RUNTIME=containerd, DEMO_INSTALL=helm installs the chart from the image built here.
demo:
	@$(MAKE) --no-print-directory -s -j2 $(STAMP) cluster-binaries
	$(LOCAL) $(BIN)/python -m localcluster.demo

cluster-up:
	@$(MAKE) --no-print-directory -s -j2 $(STAMP) cluster-binaries
	@$(LOCAL) $(BIN)/python -m localcluster up

cluster-down: $(STAMP)
	@$(LOCAL) $(BIN)/python -m localcluster down

clean:
	rm -rf $(VENV) $(NEWEST_VENV) dra/pb build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache .coverage

# Figures, not assertions: start-up time, NodePrepareResources latency, memory;
# the device plugin's start-up, re-registration after kubelet restarts, call latency;
# dra.cel against cel-expr-python (docs/architecture.md, "CEL: why our own evaluator").
# bench_compare also runs Kubernetes' own DRA test driver (built into the cache on first use,
# about 3 minutes with the kubelet's packages in the Go build cache) and NVIDIA's gpu-kubelet-plugin
# over the fake NVML (root: its fake node's device nodes) in BENCH_RUNS alternating runs.
BENCH_RUNS ?= 3
bench: binaries
	$(LOCAL) $(BIN)/python -m tests.bench.bench_driver
	$(LOCAL) $(BIN)/python -m tests.bench.bench_deviceplugin
	$(LOCAL) $(BIN)/python -m tests.bench.bench_cel
	$(LOCAL) $(BIN)/python -m tests.bench.bench_sharing
	$(LOCAL) $(BIN)/python -m tests.bench.bench_webhook
	$(LOCAL) $(BIN)/python -m tests.bench.bench_features
	$(LOCAL) $(BIN)/python -m tests.bench.bench_compare --runs $(BENCH_RUNS)

# Pod create -> Running on the local cluster: a GPU by ResourceClaim through dra-gpu, nvidia.com/gpu
# through dra-gpu's device plugin, a claim through Kubernetes' Go DRA test driver, and the same claim
# through NVIDIA's driver in dra-gpu's place, alternated (docs/testing.md has the last run's figures).
# Minutes; not part of `make bench`.
bench-pods: binaries
	$(LOCAL) $(BIN)/python -m tests.bench.bench_pods --rounds $(BENCH_RUNS)

# Prepare, unprepare and the driver's RSS with 10 and with 1,000 claims held on 256 devices (shares
# and dynamic-MIG offers), BENCH_RUNS fresh drivers; flat is a ratio of 1.00x. Then the same node's
# device state alone (no cluster, no gRPC). Not part of `make bench`.
bench-scale: binaries
	$(LOCAL) $(BIN)/python -m tests.bench.bench_scale --runs $(BENCH_RUNS)
	$(LOCAL) $(BIN)/python -m tests.bench.bench_scale_state --runs $(BENCH_RUNS)

# The real scheduler placing GPU claims on 100 and 500 kubelet-less nodes, per slice layout, NVIDIA's
# dynamic-MIG slices among them (docs/mig.md: what dynamic MIG costs the scheduler). Minutes; not
# part of `make bench`.
bench-scheduler: binaries
	$(LOCAL) $(BIN)/python -m tests.bench.bench_scheduler

# The real scheduler packing claims on a node of fake GPUs, the pods arriving one at a time in seeded random
# orders, for each publishing order, beside the best packing of the same devices (docs/mig.md, "Publishing
# order"). About a minute. PACKING_FLAGS=--nvidia adds NVIDIA's driver's slices (needs root); with
# KUBERNETES_VERSION=v1.37.2 the shares too. Not part of `make bench`.
PACKING_FLAGS ?=
bench-packing: binaries
	$(LOCAL) $(BIN)/python -m tests.bench.bench_packing $(PACKING_FLAGS)

# 10,000 prepare/unprepare cycles against the driver process: RSS, checkpoint size, fds and threads at
# 0, 1k, 5k and 10k cycles must stay flat (docs/testing.md has the last run's figures). Not in `make test`.
SOAK_CYCLES ?= 10000
soak: binaries
	$(LOCAL) $(BIN)/python -m tests.bench.soak_driver --cycles $(SOAK_CYCLES)
