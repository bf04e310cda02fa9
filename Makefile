# The common tasks. `make demo` and `make test` are the README's two commands.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: setup demo test lint rules unit integration faults clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py sluicegate/schemas/_speedups.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: setup
	$(BIN)/sluicegate demo

lint: setup
	$(BIN)/ruff check sluicegate tests bench examples
	$(BIN)/mypy

# The Prometheus rules in deploy/prometheus: their syntax, the example configuration, and
# their unit tests (promtool, from Debian's `prometheus` package). Without promtool they are
# skipped with a line saying so, unless SLUICEGATE_REQUIRE_PROMETHEUS is set (.ci/run sets it).
rules:
	@if command -v promtool >/dev/null; then set -ex; \
	  promtool check rules deploy/prometheus/sluicegate.rules.yml; \
	  promtool check config deploy/prometheus/prometheus.yml; \
	  promtool test rules deploy/prometheus/sluicegate.rules.test.yml; \
	else \
	  echo "promtool not found: the rules are not checked (Debian: apt-get install prometheus)"; \
	  test -z "$$SLUICEGATE_REQUIRE_PROMETHEUS"; \
	fi

# In memory, no broker: about a minute.
unit: setup
	$(BIN)/pytest tests/unit -q

# The broker suites: the session starts a local broker (and the schema registry for the
# tests that need one) and stops it at the end.
integration: setup
	$(BIN)/pytest tests/integration tests/faults -q

# Every suite (unit, broker, faults) on each state backend: the default (memory), then
# RocksDB (docs/decisions/state-backends.md). A test that runs on both backends itself
# (marked both_backends) runs in the first pass only.
test: lint rules
	$(BIN)/pytest -q
	SLUICEGATE_STATE_BACKEND=rocksdb $(BIN)/pytest -q -m "not both_backends"

# The fault suite (tests/faults, part of `make test`) with ten times the traffic and faults.
faults: setup
	SLUICEGATE_FAULTS_SCALE=10 $(BIN)/pytest tests/faults -q

clean:
	rm -rf $(VENV) .sluicegate .pytest_cache .mypy_cache .ruff_cache .hypothesis
