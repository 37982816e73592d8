# accelbench: the commands a user needs. `make help` lists them.
PYTHON ?= python3
# The image (and so the devcontainer) brings its own environment and says where: ACCELBENCH_ENV.
VENV   := $(or $(ACCELBENCH_ENV),.venv)
# BIN is absolute, for PATH and the recipes (quoted there: a checkout's path may hold
# spaces); make's own targets name the relative $(VENV)/bin/uv, as make cannot name a file
# whose path holds a space.
BIN    := $(abspath $(VENV))/bin
PORT   ?= 5000
HOST   ?= 127.0.0.1
PY     ?= 3.12

# Tools from the venv come first, so `accelbench` in dvc.yaml resolves without activating it.
export PATH := $(BIN):$(PATH)
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := true

.DEFAULT_GOAL := help
.PHONY: help setup hooks repro smoke test test-full lint format ui server lock wheelhouse container-test schema metrics plots exps compare-md clean clean-history

help:  ## list the commands
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

# uv installs the environment from uv.lock; the uv that does it is the lock's own version.
UV_VERSION := $(shell sed -n '/^name = "uv"$$/{n;s/^version = "\(.*\)"$$/\1/p;}' uv.lock)
export UV_PROJECT_ENVIRONMENT := $(VENV)

ifdef ACCELBENCH_ENV
setup:  ## create .venv from uv.lock, dev group included (only when missing or stale)
	@echo "Using the image's environment $(ACCELBENCH_ENV) (rebuild the image after a lock change)."
else
setup: $(VENV)/.installed
endif

# The contributors' commit-message check (CONTRIBUTING.md), in a git checkout only; leaves a
# hooks path the user set alone. Not part of setup: a user committing a run's results
# ("git commit -m baseline") writes their messages their own way.
hooks:  ## contributors: check commit messages as CONTRIBUTING.md asks
	@hooks="$$(git config --get core.hooksPath)"; \
	if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
	  echo "make hooks: not a git checkout: nothing to install" >&2; exit 1; \
	elif [ -z "$$hooks" ]; then git config core.hooksPath .githooks && \
	  echo "make hooks: commit messages are checked now (.githooks/commit-msg)"; \
	elif [ "$$hooks" = .githooks ] || [ "$$hooks" = "$(CURDIR)/.githooks" ]; then \
	  echo "make hooks: commit messages are checked already"; \
	else echo "make hooks: core.hooksPath is $$hooks already, left as it is: call" \
	  ".githooks/commit-msg from your commit-msg hook there" >&2; exit 1; fi

# `uv sync --locked` refuses a uv.lock that no longer matches pyproject.toml (run `make lock`),
# installs exactly the lock's runtime and dev groups with their hashes checked, and removes
# anything else from the environment. Byte-compiled at install, as pip does: without .pyc
# files (a read-only environment, PYTHONDONTWRITEBYTECODE) every stage process recompiles
# MLflow and its stack from source, seconds per stage.
$(VENV)/.installed: uv.lock pyproject.toml | $(VENV)/bin/uv
	"$(BIN)/uv" sync --locked --quiet --compile-bytecode --extra plots --extra team
	touch "$@"

$(VENV)/bin/uv:
	$(PYTHON) -m venv "$(VENV)"
	"$(BIN)/python" -m pip install --quiet "uv==$(UV_VERSION)"

# params.yaml checked first: DVC parses it itself and runs out of memory on a YAML alias bomb.
repro: setup  ## run the whole DVC pipeline (dvc repro)
	@accelbench check
	dvc repro

# A first result in minutes (docs/pipeline.md): the whole pipeline on a tenth of MNIST as the
# DVC experiment `smoke`, run in a copy of the workspace (--temp), so the workspace's outputs
# and dvc.lock stay as they are; its report is then copied out of the experiment, whole into a
# new folder that replaces the last one (`dvc get` would put it inside an existing folder).
SMOKE := -S train.train_subset=6000 -S train.test_subset=1000 -S train.epochs=3 -S variants.cpu.epochs=3
smoke: setup  ## a first result in about 2 minutes: the pipeline on a tenth of MNIST (reports/smoke/)
	dvc exp run --temp --force --name smoke $(SMOKE)
	rm -rf reports/.smoke.new
	dvc get . reports --rev smoke --out reports/.smoke.new
	rm -rf reports/smoke && mv reports/.smoke.new reports/smoke
	@echo "make smoke: wrote reports/smoke/comparison.md; the full run is make repro"

# Two tiers (pyproject.toml's `slow` marker): the fast one covers every module in at most
# 5 minutes on 2 cores; the full one adds the end-to-end runs, the browser and service
# (PostgreSQL, sshd) tests and those a GPU host skips, as CI (.ci/run) runs them. Both run on
# WORKERS processes (pytest-xdist; a module whose fixtures start a server or a run keeps its
# tests on one, by its xdist_group mark): the full tier is mostly subprocesses that start up
# on one core each: two workers took it from 74 to 43 minutes on CI's two cores.
WORKERS ?= 2
test: setup lint  ## lint, then the fast tests (every module; at most 5 min on 2 cores)
	pytest -n $(WORKERS) --dist loadgroup -m "not slow"

test-full: setup lint  ## lint, then every test: slow, browser and service tests too (CI's)
	pytest -n $(WORKERS) --dist loadgroup

lint: setup  ## ruff lint + format check, hadolint on the Dockerfile
	ruff check src tests tools benchmarks
	ruff format --check src tests tools benchmarks
	hadolint Dockerfile

format: setup  ## apply ruff's fixes and formatting
	ruff check --fix src tests tools benchmarks
	ruff format src tests tools benchmarks

ui: setup  ## MLflow UI over mlflow.db (default http://127.0.0.1:5000; PORT=, HOST= to change)
	accelbench ui --host $(HOST) --port $(PORT)

# A team's tracking server (docs/teams.md): the database and artifact store come from
# MLFLOW_BACKEND_STORE_URI and MLFLOW_ARTIFACTS_DESTINATION; HOST=0.0.0.0 serves the team.
server: setup  ## MLflow server for a team: runs in PostgreSQL, artifacts proxied (docs/teams.md)
	accelbench server --host $(HOST) --port $(PORT)

lock: | $(VENV)/bin/uv  ## re-resolve uv.lock after a change to pyproject.toml (all three platforms)
	"$(BIN)/uv" lock

# The wheelhouse leaves out what the target host has, and only the host can say what that is.
ifneq ($(filter wheelhouse,$(MAKECMDGOALS)),)
ifndef HOST_PACKAGES
$(error make wheelhouse needs HOST_PACKAGES=FILE, the host's packages (`python3 -m pip list --format=freeze` there, or tools/host-packages/nvidia-h200.txt; an empty file for a bare host))
endif
endif

wheelhouse: setup  ## wheels for an air-gapped host: make wheelhouse PY=3.12 HOST_PACKAGES=FILE
	"$(BIN)/python" tools/wheelhouse.py --python-version $(PY) --host-packages $(HOST_PACKAGES) --out .whl

container-test: setup  ## build the image and run the pipeline in it (root, buildah + podman; ~15 min)
	bash tools/container-test.sh

schema: setup  ## regenerate docs/params.schema.json (editors' completion for params.yaml)
	python tools/params_schema.py

# DVC's comparison (docs/comparing-with-dvc.md): the workspace against HEAD, whose figures
# are a committed run: the NVIDIA H200 run of record until a user commits their own. Each
# target names that run by the commit that last changed reports/metrics.
HEAD_RUN = run="$$(git log -1 --format='%h (%as) %s' HEAD -- reports/metrics 2>/dev/null)"; \
  echo "$${run:-none committed}"

# The variants trained here beside HEAD's figures (`dvc metrics diff --targets`), then one line
# naming those skipped here: without a GPU, DVC's own diff against the H200 run of record
# listed about 50 rows, most `-` (tools/metrics_diff.py).
metrics: setup  ## the figures of the variants trained here beside HEAD's run, and those skipped
	@python tools/metrics_diff.py "$$($(HEAD_RUN))"

# `dvc plots show` alone loads Vega from a CDN: `make plots` renders with Vega inlined, from
# the vl-convert-python package, so the page draws offline too. Without REV it draws the
# workspace beside HEAD when their plot data differ (a run beside the committed one).
PLOTS_TEMPLATE := .dvc/tmp/offline-plots.html

plots: setup  ## dvc plots, drawn offline: dvc_plots/index.html, beside HEAD's run (REV= another)
	python -m accelbench.report.dvc_plots --html-template $(PLOTS_TEMPLATE)
	@rev="$(REV)"; git diff --quiet HEAD -- reports/plots 2>/dev/null || rev="$${rev:-HEAD}"; \
	if [ -z "$$rev" ]; then echo "dvc plots show"; dvc plots show --html-template $(PLOTS_TEMPLATE); \
	else if [ "$$rev" = HEAD ]; then echo "dvc plots diff HEAD (HEAD's figures: $$($(HEAD_RUN)))"; \
	  else echo "dvc plots diff $$rev"; fi; \
	  dvc plots diff "$$rev" --html-template $(PLOTS_TEMPLATE) && echo "(a revision's plot data" \
	  "comes from git; its confusion matrices and summary image only from this DVC cache)"; fi

exps: setup  ## DVC experiments side by side: changed params, each variant's figures (120 columns)
	@echo "HEAD's figures: $$($(HEAD_RUN))"
	dvc exp show --json --no-pager | python tools/exp_table.py

# Markdown for a pull request: the params that differ, then the figures that changed, each
# with HEAD's value beside the workspace's (or experiment EXP's).
compare-md: setup  ## markdown for a pull request: params and figures against HEAD (EXP= an experiment)
	@echo "Compared with HEAD's figures, from $$($(HEAD_RUN)):"
	@echo
	@dvc params diff --md HEAD $(EXP)
	@dvc metrics diff --md HEAD $(EXP)

# Pipeline outputs that git does not track (`dvc checkout` restores them from the DVC cache;
# `dvc repro` re-runs their stages: DVC's run cache skips the train stages, whose compile
# cache is a persistent output). dvc.lock and compare's figures (reports/metrics, reports/plots) are
# what a user commits after a run, so they stay; the run history (MLflow store, DVC cache
# and experiment queue) goes only by its own target.
OUTPUTS = data models metrics env checkpoints $(filter-out reports/metrics reports/plots,$(wildcard reports/*))
HISTORY := mlflow.db mlflow.db.lock mlartifacts mlruns .accelbench compile-cache .dvc/cache .dvc/tmp

clean:  ## remove pipeline outputs (keeps the run history: mlflow.db, the DVC cache)
	rm -rf $(OUTPUTS)
	@echo "Kept dvc.lock, reports/metrics, reports/plots and the run history. \`dvc checkout\` puts"
	@echo "the cached outputs back, and the next \`dvc repro\` remakes env/ alone (never cached);"
	@echo "\`dvc repro\` without the checkout re-runs the stages (downloading and training again)."

# It cannot be undone, so it lists what it deletes and asks; where no one can answer (no
# terminal: CI, a script) it deletes only with YES=1, and otherwise deletes nothing.
clean-history:  ## DELETE the run history, after asking: MLflow store and artifacts, DVC cache and queue, compile caches
	@found="$$(for p in $(HISTORY); do if [ -e "$$p" ] || [ -L "$$p" ]; then echo "$$p"; fi; done)"; \
	if [ -z "$$found" ]; then echo "No run history here: nothing to delete."; exit 0; fi; \
	echo "make clean-history deletes the run history, for good:"; du -sh $$found | sed 's/^/  /'; \
	if [ "$(YES)" != 1 ]; then \
	  if [ ! -t 0 ]; then \
	    echo "Nothing deleted: no terminal to ask on. Run \`make clean-history YES=1\` to delete without asking." >&2; \
	    exit 1; fi; \
	  printf 'Delete them? [y/N] '; read -r answer || answer=; \
	  case "$$answer" in [yY]|[yY][eE][sS]) ;; *) echo "Nothing deleted."; exit 0;; esac; \
	fi; \
	rm -rf $$found && echo "Deleted."
