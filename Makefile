# The front door. `make run` and `make test` are all a newcomer needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint bench install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

## run: review every bundled example AdmissionReview against the bundled example cluster
run: $(STAMP)
	$(BIN)/cardquota status --cluster examples/cluster
	$(BIN)/cardquota examples examples

## test: lint, type-check, layer contracts and the whole test suite
test: $(STAMP) lint
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check webhook tests
	$(BIN)/ruff format --check webhook tests
	$(BIN)/mypy
	$(BIN)/lint-imports

## bench: decision latency with 1,000 and 100,000 pods in the snapshot
bench: $(STAMP)
	$(BIN)/python -m tests.bench.decide

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
