# The front door. `make run` and `make test` are all a newcomer needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

PORT   ?= 8443
# pytest-xdist workers for make test: they run the lanes of tests/conftest.py side by side
WORKERS ?= 3
# how many of the slowest tests make test lists (0: every one, for a per-module account)
DURATIONS ?= 25
CURL   := curl -sS --cacert certs/ca.crt -H 'Content-Type: application/json' --data-binary @examples/reviews/pod-over-quota.json https://127.0.0.1:$(PORT)/validate

IMAGE  ?= cardquota:0.1.0
BASE   ?=
BUILD_ARGS := $(if $(BASE),--build-arg BASE=$(BASE))

.PHONY: run examples test check lint bench install clean e2e-bin e2e cluster cluster-down certs dev-certs image lock plugin-archive

$(STAMP): pyproject.toml requirements-test.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c requirements-test.lock -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

## run: serve the webhook over HTTPS on the bundled example cluster (Ctrl-C stops it)
run: dev-certs
	@echo "cardquota serves https://127.0.0.1:$(PORT) from examples/cluster; in another shell try:"
	@echo
	@echo "  $(CURL)"
	@echo
	$(BIN)/cardquota serve --cluster examples/cluster --cert-dir certs --host 127.0.0.1 --port $(PORT) --drain-seconds 0

## dev-certs: a development CA and serving certificate in certs/ (never committed)
dev-certs: $(STAMP)
	$(BIN)/cardquota dev-certs certs

## examples: review every bundled example AdmissionReview offline, after the cluster's status
examples: $(STAMP)
	$(BIN)/cardquota status --cluster examples/cluster
	$(BIN)/cardquota examples examples

## test: lint, type-check, layer contracts and the whole test suite (end-to-end included): what CI runs
test: $(STAMP) lint e2e-bin
	@if [ -n "$$CARDQUOTA_E2E_REFUSED_SECONDS" ] && [ "$$CARDQUOTA_E2E_REFUSED_SECONDS" != 180 ]; then \
		echo "make test keeps the waiting line's 180 s refusal: unset CARDQUOTA_E2E_REFUSED_SECONDS"; exit 2; fi
	$(BIN)/pytest -q -n $(WORKERS) --dist loadgroup --durations=$(DURATIONS)

## check: the tier to iterate with (about 5 minutes): lint, type check, core, edges and the plain control-plane tests
PARTNER_TESTS := tests/e2e/test_scheduler_agreement.py tests/e2e/test_stock_volcano.py tests/e2e/test_waiting_line.py tests/e2e/test_tidal_reclaim.py tests/e2e/test_dra.py
check: $(STAMP) lint e2e-bin
	$(BIN)/pytest -q -n 2 --dist loadgroup $(addprefix --ignore=,$(PARTNER_TESTS))

## plugin-archive: the kubectl plugin's release archive (wheel + launcher) and its sha256, for plugins/cardquota.yaml
PLUGIN_OUT ?= out/plugin
plugin-archive: $(STAMP)
	rm -rf $(PLUGIN_OUT) && mkdir -p $(PLUGIN_OUT)/archive $(PLUGIN_OUT)/source
	@# built from a copy: the wheel build writes build/ where it runs, and never in the tree
	tar -c --exclude=./.git --exclude=./.venv --exclude=./.lock-venv --exclude=./out --exclude=./build \
		--exclude='*.egg-info' --exclude='./.*_cache' --exclude=./.hypothesis --exclude='__pycache__' . | tar -x -C $(PLUGIN_OUT)/source
	$(BIN)/pip wheel --no-deps --quiet --disable-pip-version-check -w $(PLUGIN_OUT)/archive $(PLUGIN_OUT)/source
	rm -rf $(PLUGIN_OUT)/source
	cp plugins/kubectl-cardquota $(PLUGIN_OUT)/archive/
	tar -C $(PLUGIN_OUT)/archive -czf $(PLUGIN_OUT)/kubectl-cardquota.tar.gz .
	sha256sum $(PLUGIN_OUT)/kubectl-cardquota.tar.gz

## e2e-bin: build the control-plane binaries once per machine (cached outside the repository)
e2e-bin: $(STAMP)
	$(BIN)/python -m tests.e2e.build

## e2e: only the end-to-end tests against a real control plane
e2e: e2e-bin
	$(BIN)/pytest -q tests/e2e

## cluster: a local control plane with fake GPU nodes and the webhook on its live cache, to try with kubectl (VOLCANO=stock: released Volcano instead of the capacity-card fork)
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

## bench: pod creates and scale-ups through the local API server with and without the webhooks, then the server under wrk next to a floor handler (1k/10k/100k pods) and a device-plugin pod create through it against the commit before DRA, the decision core alone, a pod create against the commit before, the multi-card check, the first sync, the enqueue gate with 100 Volcano Jobs waiting, a review forwarded by a standby against a direct one and the Lease's API load, and how long a refused or held workload stays down after its cards free with the waiting line (deny and wait mode) and without (real scheduler), an inference scale-up against training holding every card with tidal reclaim and with each partner alone, one reclaim pass at 100,000 waiting pods (tidal, and for borrowing: the ratio) and the reviews answered meanwhile, beside the serving replica's own passes too (cards alone, then with CPU requests), and a DRA pod's decision next to a device-plugin pod's, the bytes kept per claim and slice device and the first sync of 10,000 claims, and reviews answered while templates of costly selectors arrive at 1,000 devices against none
bench: $(STAMP) e2e-bin
	$(BIN)/python -m tests.bench.apiserver
	@command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; } || \
		{ echo "make bench needs wrk (Debian package wrk)"; exit 1; }
	$(BIN)/python -m tests.bench.serve
	$(BIN)/python -m tests.bench.serve --reference cc74f51 --pods 1000,100000 --rounds 10 --seconds 2 --connections 1
	$(BIN)/python -m tests.bench.decide
	$(BIN)/python -m tests.bench.admit
	$(BIN)/python -m tests.bench.feasibility
	$(BIN)/python -m tests.bench.sync
	$(BIN)/python -m tests.bench.enqueue
	$(BIN)/python -m tests.bench.forward
	$(BIN)/python -m tests.bench.line
	$(BIN)/python -m tests.bench.tidal
	$(BIN)/python -m tests.bench.reclaim --rounds 2 --reviews 2000 --serving-reviews 5000
	$(BIN)/python -m tests.bench.reclaim --rounds 2 --reviews 500 --cpu
	$(BIN)/python -m tests.bench.dra
	$(BIN)/python -m tests.bench.filters
	$(BIN)/python -m tests.bench.celbudget

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

## image: build the container image with whichever OCI builder is present (BASE=... to change the base)
image:
	@if docker info >/dev/null 2>&1; then docker build $(BUILD_ARGS) -t $(IMAGE) .; \
	elif command -v buildah >/dev/null; then buildah bud --isolation chroot $(BUILD_ARGS) -t $(IMAGE) .; \
	elif command -v podman >/dev/null; then podman build $(BUILD_ARGS) -t $(IMAGE) .; \
	else echo "make image needs a running docker, or buildah, or podman"; exit 1; fi

## lock: re-pin the image's runtime dependencies (requirements.lock) and the test and lint tools (requirements-test.lock) from clean virtualenvs
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv && .lock-venv/bin/pip install --quiet .
	{ echo "# The runtime dependencies of the image, pinned: pip freeze of a clean venv after \`pip install .\`."; \
	  echo "# Refresh with: make lock"; .lock-venv/bin/pip freeze --exclude cardquota; } > requirements.lock
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv && .lock-venv/bin/pip install --quiet '.[test]'
	{ echo "# The test and lint tools with every dependency, pinned: pip freeze of a clean venv after \`pip install '.[test]'\`."; \
	  echo "# make install installs with it as constraints, so every machine runs the same ruff, mypy, pytest and hypothesis."; \
	  echo "# Refresh with: make lock (it refreshes requirements.lock too)"; .lock-venv/bin/pip freeze --exclude cardquota; } > requirements-test.lock
	rm -rf .lock-venv build
