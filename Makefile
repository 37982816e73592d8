# accelbench: the commands a user needs. `make help` lists them.
PYTHON ?= python3
# The image (and so the devcontainer) brings its own environment and says where: ACCELBENCH_ENV.
VENV   := $(or $(ACCELBENCH_ENV),.venv)
BIN    := $(CURDIR)/$(VENV)/bin
PORT   ?= 5000
HOST   ?= 127.0.0.1
PY     ?= 3.12

# Tools from the venv come first, so `accelbench` in dvc.yaml resolves without activating it.
export PATH := $(BIN):$(PATH)
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := true

.DEFAULT_GOAL := help
.PHONY: help setup repro test lint format ui lock wheelhouse container-test schema clean clean-history

help:  ## list the commands
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

# uv installs the environment from uv.lock; the uv that does it is the lock's own version.
UV_VERSION := $(shell sed -n '/^name = "uv"$$/{n;s/^version = "\(.*\)"$$/\1/p;}' uv.lock)
export UV_PROJECT_ENVIRONMENT := $(VENV)

ifdef ACCELBENCH_ENV
setup:  ## create .venv from uv.lock, dev group included (only when missing or stale)
	@echo "Using the image's environment $(ACCELBENCH_ENV) (rebuild the image after a lock change)."
else
setup: $(VENV)/.installed
endif

# `uv sync --locked` refuses a uv.lock that no longer matches pyproject.toml (run `make lock`),
# installs exactly the lock's runtime and dev groups with their hashes checked, and removes
# anything else from the environment. Byte-compiled at install, as pip does: without .pyc
# files (a read-only environment, PYTHONDONTWRITEBYTECODE) every stage process recompiles
# MLflow and its stack from source, seconds per stage.
$(VENV)/.installed: uv.lock pyproject.toml | $(BIN)/uv
	$(BIN)/uv sync --locked --quiet --compile-bytecode
	touch $@

$(BIN)/uv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "uv==$(UV_VERSION)"

repro: setup  ## run the whole DVC pipeline (dvc repro)
	dvc repro

test: setup lint  ## lint, then run the test suite
	pytest

lint: setup  ## ruff lint + format check, hadolint on the Dockerfile
	ruff check src tests tools benchmarks
	ruff format --check src tests tools benchmarks
	hadolint Dockerfile

format: setup  ## apply ruff's fixes and formatting
	ruff check --fix src tests tools benchmarks
	ruff format src tests tools benchmarks

ui: setup  ## MLflow UI over mlflow.db (default http://127.0.0.1:5000; PORT=, HOST= to change)
	@python -c 'import sys; from pathlib import Path; from accelbench.tracking import training_view_url as url; print("Open", url(sys.argv[1], Path("mlflow.db")))' http://$(HOST):$(PORT)
	mlflow server --backend-store-uri sqlite:///$(CURDIR)/mlflow.db --host $(HOST) --port $(PORT)

lock: | $(BIN)/uv  ## re-resolve uv.lock after a change to pyproject.toml (all three platforms)
	$(BIN)/uv lock

# The wheelhouse leaves out what the target host has, and only the host can say what that is.
ifneq ($(filter wheelhouse,$(MAKECMDGOALS)),)
ifndef HOST_PACKAGES
$(error make wheelhouse needs HOST_PACKAGES=FILE, the host's packages (`python3 -m pip list --format=freeze` there, or tools/host-packages/nvidia-h200.txt; an empty file for a bare host))
endif
endif

wheelhouse: setup  ## wheels for an air-gapped host: make wheelhouse PY=3.12 HOST_PACKAGES=FILE
	$(BIN)/python tools/wheelhouse.py --python-version $(PY) --host-packages $(HOST_PACKAGES) --out .whl

container-test: setup  ## build the image and run the pipeline in it (root, buildah + podman; ~15 min)
	bash tools/container-test.sh

schema:  ## regenerate docs/params.schema.json (editors' completion for params.yaml)
	python tools/params_schema.py

# Pipeline outputs (`dvc repro` restores them from the DVC cache or re-runs their stages);
# the run history (MLflow store, DVC cache and experiment queue) only by its own target.
OUTPUTS := data models metrics reports env checkpoints dvc.lock
HISTORY := mlflow.db mlartifacts mlruns .accelbench .dvc/cache .dvc/tmp

clean:  ## remove pipeline outputs (keeps the run history: mlflow.db, the DVC cache)
	rm -rf $(OUTPUTS)

clean-history:  ## DELETE the run history: MLflow store and artifacts, DVC cache and queue
	rm -rf $(HISTORY)
