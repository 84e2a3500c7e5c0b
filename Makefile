# The front door. `make run` and `make test` are all a newcomer needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint bench install clean e2e-bin e2e cluster cluster-down certs

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

## test: lint, type-check, layer contracts and the whole test suite (end-to-end included)
test: $(STAMP) lint e2e-bin
	$(BIN)/pytest -q

## e2e-bin: build the control-plane binaries once per machine (cached outside the repository)
e2e-bin: $(STAMP)
	$(BIN)/python -m tests.e2e.build

## e2e: only the end-to-end tests against a real control plane
e2e: e2e-bin
	$(BIN)/pytest -q tests/e2e

## cluster: start a local control plane with fake GPU nodes to try things with kubectl
cluster: e2e-bin
	$(BIN)/python -m tests.e2e.cluster up

cluster-down: $(STAMP)
	$(BIN)/python -m tests.e2e.cluster down

## certs: development CA, API server, admin and webhook certificates in certs/ (never committed)
certs: $(STAMP)
	$(BIN)/python -m tests.e2e.pki certs

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
