# Vigil: `make test` and `make demo` set everything up themselves on a fresh machine.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# The test stack lives apart from a developer's `vigil up` stack.
TEST_ENV := VIGIL_LOCAL_DATA_DIR=.vigil/test-stack VIGIL_LOCAL_KAFKA_PORT=29092 \
            VIGIL_LOCAL_CONTROLLER_PORT=29093 VIGIL_LOCAL_REDIS_PORT=26379 \
            VIGIL_LOCAL_SLURMCTLD_PORT=26817 VIGIL_LOCAL_SLURMD_PORT=26818

.PHONY: install test lint unit soak fleet-soak demo up down clean

# The distribution was called "vigil" before issue #48: its editable install is dropped.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip uninstall -q -y vigil 2>/dev/null || true
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Starts the local Kafka + Redis unless VIGIL_KAFKA_BOOTSTRAP / VIGIL_REDIS_URL name
# existing ones, runs lint and the whole suite, and stops what it started. The tests
# against the stack run in order in one pytest (some stop and restart its broker);
# the CPU-only tests run beside them in another, their report printed after.
# TEST_SERIAL=1 runs everything in one pytest.
UNIT_LOG := .vigil/unit-tests.log
# each lane's slowest tests, for keeping `make test` near 15 minutes
PYTEST_ARGS ?= --durations=15
test: $(STAMP)
	$(MAKE) lint
	$(TEST_ENV) $(BIN)/vigil up
	set -o pipefail; rc=0; mkdir -p .vigil; \
	if [ -n "$(TEST_SERIAL)" ]; then \
	  $(TEST_ENV) $(BIN)/pytest -q -m 'not soak' $(PYTEST_ARGS) || rc=$$?; \
	else \
	  $(TEST_ENV) $(BIN)/pytest -q -m 'not integration and not soak' -p no:cacheprovider \
	    $(PYTEST_ARGS) >$(UNIT_LOG) 2>&1 & \
	  unit=$$!; \
	  $(TEST_ENV) $(BIN)/pytest -q -m 'integration and not soak' $(PYTEST_ARGS) || rc=$$?; \
	  wait $$unit || rc=$$?; echo "--- the CPU-only tests ($(UNIT_LOG)):"; cat $(UNIT_LOG); \
	fi; \
	$(TEST_ENV) $(BIN)/vigil down; exit $$rc

unit: $(STAMP)
	$(BIN)/pytest -q -m 'not integration and not soak' $(PYTEST_ARGS)

# Long reliability runs (a channel down 10 min, twice the worker's throughput for
# 10 min, then draining): about 35 minutes and ~31 GB of broker disk while it runs.
# SOAK_SECONDS / SOAK_RATE scale them.
soak: $(STAMP)
	$(TEST_ENV) $(BIN)/vigil up
	set -o pipefail; rc=0; $(TEST_ENV) $(BIN)/pytest -q -s -m soak tests/reliability \
	  $(PYTEST_ARGS) || rc=$$?; $(TEST_ENV) $(BIN)/vigil down; exit $$rc

# False alarms on 50,000 healthy GPU-hours of simulated jobs, replayed offline (issue
# #14, #28): about an hour on 2 idle cores (3,529 s measured, 2026-11-25).
# FLEET_ARGS="--gpu-hours 5000" for a shorter run.
fleet-soak: $(STAMP)
	$(BIN)/python bench/fleet_soak.py $(FLEET_ARGS)

demo: $(STAMP)
	$(BIN)/python -m vigil_gpu_monitor.vigil.evaluation.demo

up: $(STAMP)
	$(BIN)/vigil up

down: $(STAMP)
	$(BIN)/vigil down

clean:
	rm -rf .vigil build *.egg-info
