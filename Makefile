# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pytest's own timeout per test guards CI against a hung service, not slowness.
PYTEST_ARGS ?= -q --timeout=600

.PHONY: install demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the dependency pins change; the project itself is editable.
$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,ui,postgres,celery]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/solaris demo $(DEMO_ARGS)

# tests/conftest.py makes sure a Redis answers at REDIS_URL (default redis://127.0.0.1:6379/0),
# starting a throwaway redis-server on a free port when none does.
test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check solaris_feast tests dags feature_repo benchmarks
	$(BIN)/ruff format --check solaris_feast tests dags feature_repo benchmarks
	$(BIN)/mypy solaris_feast dags tests

bench: $(STAMP)
	$(BIN)/solaris bench serve --json benchmarks/results/serve.json
	$(BIN)/solaris bench write --json benchmarks/results/write.json

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache
