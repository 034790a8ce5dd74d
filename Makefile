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

.PHONY: install run test test-fast lint bench compile images pin-base-images clean help

help:
	@echo "make run     install, then run the pipeline locally on data/tinyshakespeare.txt"
	@echo "make test    install, then run the whole test suite"
	@echo "make lint    ruff and mypy"
	@echo "make bench   benchmarks (ratios against a reference in the same run)"
	@echo "make images REGISTRY=...  build + push both images, write images/digests.json"
	@echo "make pin-base-images      pin the Dockerfiles' base images to today's digests"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/gptpipe run --local $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not e2e" $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m bench $(ARGS)

compile: $(STAMP)
	$(BIN)/gptpipe compile --output gptpipe.yaml $(ARGS)

# Needs a docker buildx builder and a registry login; writes the lock `gptpipe compile` reads.
images:
	@test -n "$(REGISTRY)" || { echo "usage: make images REGISTRY=ghcr.io/you"; exit 2; }
	@git diff --quiet HEAD 2>/dev/null || echo "warning: uncommitted changes are built into $(REVISION)"
	$(PYTHON) images/build.py build --registry $(REGISTRY) --revision $(REVISION)

pin-base-images:
	$(PYTHON) images/build.py pin-base

clean:
	rm -rf runs local_outputs .pytest_cache .ruff_cache .mypy_cache
