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

ifdef ACCELBENCH_ENV
setup:  ## create .venv from requirements.lock (only when missing or stale)
	@echo "Using the image's environment $(ACCELBENCH_ENV) (rebuild the image after a lock change)."
else
setup: $(VENV)/.installed
endif

$(VENV)/.installed: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

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

lock:  ## re-resolve requirements.lock from pyproject.toml in a throwaway venv
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet --upgrade pip
	.lock-venv/bin/python -m pip install --quiet -e '.[dev]'
	{ sed -n '1,3p' requirements.lock; .lock-venv/bin/python -m pip freeze --exclude-editable; } > requirements.lock.new
	mv requirements.lock.new requirements.lock && rm -rf .lock-venv

wheelhouse:  ## wheels for an air-gapped Python $(PY) x86_64 host into .whl/ (make wheelhouse PY=3.12)
	$(PYTHON) tools/wheelhouse.py --python-version $(PY) --out .whl

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
