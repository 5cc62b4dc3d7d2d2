# Meridian's two commands:
#   make run    start Meridian on the embedded default (SQLite, file-system broker, demo fleet)
#   make test   set up and run the whole test suite against PostgreSQL (and RabbitMQ)
# Extras: make lint, make bench, make run RESET=1 (fresh embedded database), make run PORT=8001

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
HOST ?= 127.0.0.1
PYTEST_WORKERS ?= 2
# The suite runs on PostgreSQL; DATABASE_URL overrides where it lives.
TEST_DATABASE_URL := $(or $(DATABASE_URL),postgres://postgres@127.0.0.1:5432/meridian)

.PHONY: run test lint bench services

run: $(VENV)/.runtime
	$(BIN)/python manage.py up --host $(HOST) --port $(PORT) $(if $(RESET),--reset,)

test: $(VENV)/.dev services
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	env -u DATABASE_URL $(BIN)/python manage.py makemigrations --check --dry-run
	DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

lint: $(VENV)/.dev
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

bench: $(VENV)/.dev services
	for b in seed_fleet api_latency ranking planner scheduler_cycle claims trace_replay provisioning attestation console_pages failure_drill telemetry_ingest storage_steps checkpoint_moves inference_packing autoscale month_close failover; do \
	  DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/python bench/$$b.py || exit 1; done

services:
	scripts/ensure-services

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.runtime: requirements.txt | $(BIN)/python
	$(BIN)/pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.dev: requirements.txt requirements-dev.txt requirements-vm.txt | $(BIN)/python
	$(BIN)/pip install --quiet -r requirements-dev.txt
	scripts/ensure-libvirt
	scripts/ensure-chromium
	scripts/ensure-haproxy
	scripts/ensure-promtool
	pkg-config --exists libvirt 2>/dev/null && $(BIN)/pip install --quiet -r requirements-vm.txt || true
	touch $@ $(VENV)/.runtime
