# Two commands for a fresh machine: `make run` and `make test`. Both build .venv from the lock first.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
UV_VERSION := $(shell sed -n 's/^uv==\([^ ]*\).*/\1/p' requirements.lock)
# Wheels on this machine's disk, torch's CPU build among them (pip reads the same variable).
export UV_FIND_LINKS ?= $(or $(PIP_FIND_LINKS),/opt/wheels)
# Settled on the first line of every recipe that needs the environment.
ENV_STAMP := $(VENV)/.synced
export ML_LIFECYCLE_HOME ?= $(CURDIR)/.local
export DAGSTER_HOME ?= $(ML_LIFECYCLE_HOME)/dagster_home

.PHONY: help venv instance run tune backtest test test-unit dev mlflow bench lineage lint lock clean

help:
	@echo "make run    set up .venv, then run the lifecycle on the bundled data"
	@echo "make test   set up .venv, then run the test suite (all but gpu)"
	@echo "make test-unit  the unit tier alone (tests/unit), in under a minute"
	@echo "make tune  a hyperparameter study on make run's training set (TRIALS=, WORKERS=, SAVE_AS=)"
	@echo "make backtest  a rolling backtest of a catalog entry (CONFIG=, FOLDS=2013-02-01...2013-04-01)"
	@echo "make dev    open the Dagster UI on http://127.0.0.1:3000"
	@echo "make mlflow open the MLflow UI on http://127.0.0.1:5000 (training runs)"
	@echo "make bench  print the performance ratios (docs/benchmarks.md)"
	@echo "make lineage  trace a model or prediction to its raw data (ARGS=\"model --version 1\")"
	@echo "make lint   ruff + pyright"
	@echo "make lock   re-resolve requirements.lock from pyproject.toml"
	@echo "make clean  remove .local/ (all local state)"

# Bytecode is compiled here: with PYTHONDONTWRITEBYTECODE set (here and in CI) nothing else writes
# it, and every process would compile its imports again (half of `python -m ml.train`). uv compiles
# what it installs; the project's own packages (an editable install: outside site-packages) are
# compiled by compileall. A .pyc whose source has changed since is not used.
PACKAGES := declare ml assets pipelines cli resources usecases benchmarks feature_repo
$(ENV_STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"
	$(BIN)/uv pip sync --quiet --compile-bytecode --python $(BIN)/python requirements.lock
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python --no-deps -e .
	$(BIN)/python -m compileall -q $(PACKAGES)
	@# Matplotlib's font list, built now: its first import otherwise runs fc-list, a process
	@# started inside whichever test draws first (a unit test may start none).
	$(BIN)/python -c "import matplotlib.font_manager"
	@touch $@

venv: $(ENV_STAMP)

# The instance's configuration, kept in the repo, copied where Dagster reads it (every time: the
# profile may have changed): the production profile's (PostgreSQL, deploy/dagster.yaml) under
# ML_LIFECYCLE_ENV=prod.
INSTANCE_FILE := deploy/$(if $(filter prod,$(ML_LIFECYCLE_ENV)),dagster.yaml,dagster.local.yaml)
instance:
	@install -D -m 644 $(INSTANCE_FILE) $(DAGSTER_HOME)/dagster.yaml

# USE_CASE=ridership runs the second bundled use case instead of the first (flights);
# CONFIG=name trains that entry of the use case's catalog (usecases/<case>/configs/) instead of
# the one it names (baseline). ENGINE=spark builds the training set and fills the online store
# with Apache Spark (local[2]; ML_LIFECYCLE_SPARK_MASTER for another) instead of DuckDB.
run: $(ENV_STAMP) instance
	$(if $(ENGINE),ML_LIFECYCLE_ENGINE=$(ENGINE)) $(BIN)/python -m cli.run $(if $(USE_CASE),--use-case $(USE_CASE)) $(if $(CONFIG),--config $(CONFIG))

# Two test processes: the tests on the shared worlds in one, every other module as a unit of
# its own (tests/conftest.py), the longest first.
test: $(ENV_STAMP)
	$(BIN)/python -m pytest -m "not gpu" -n 2 --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

# The unit tier alone: no process, no Dagster instance, no network (tests/tiers.py), no world to
# build; the check to run after a change. Two test processes, each module in one of them (its
# module-scoped fixtures are built once): 34 s on this 2-core machine against 58 s in one.
test-unit: $(ENV_STAMP)
	$(BIN)/python -m pytest tests/unit -n 2 --dist loadgroup $(PYTEST_ARGS)

# dagster 1.13 warns at every start that `dg dev` supersedes `dagster dev`, which stays supported:
# read as something wrong with this project, so it is filtered (`dg` needs dagster-dg-cli and a dg
# project layout, neither of which this package has).
DEV_WARNINGS := ignore:Function `dev_command` is superseded

# Under cli.stops: Ctrl-C or SIGTERM reaches `dagster dev` once, as one SIGINT, and it shuts
# its webserver and daemon down; anything left 12 s later is killed (cli/stops.py says why).
DEV_PORT ?= 3000
# A hyperparameter study on the training set `make run` built (USE_CASE as above): TRIALS, WORKERS
# (side by side), START (the catalog entry trials start from), STUDY (a name: resumes it) and
# SAVE_AS (the best settings saved as that new catalog entry) override the declared ones.
tune: $(ENV_STAMP) instance
	$(BIN)/python -m cli.tune $(if $(USE_CASE),--use-case $(USE_CASE)) \
	  $(if $(TRIALS),--trials $(TRIALS)) $(if $(WORKERS),--workers $(WORKERS)) \
	  $(if $(START),--start $(START)) $(if $(STUDY),--study $(STUDY)) \
	  $(if $(SAVE_AS),--save-best-as $(SAVE_AS))

# A rolling backtest of a catalog entry (USE_CASE as above): CONFIG (default: the use case's)
# and FOLDS (a month, YYYY-MM-01, or FIRST...LAST; default: the first two folds).
backtest: $(ENV_STAMP) instance
	$(BIN)/python -m cli.backtest $(if $(USE_CASE),--use-case $(USE_CASE)) \
	  $(if $(CONFIG),--config $(CONFIG)) $(if $(FOLDS),--folds $(FOLDS))

dev: $(ENV_STAMP) instance
	PYTHONWARNINGS='$(DEV_WARNINGS)' $(BIN)/python -m cli.stops \
	  $(BIN)/dagster dev -w workspace.yaml --host 127.0.0.1 --port $(DEV_PORT)

mlflow: $(ENV_STAMP)
	@echo "MLflow on http://127.0.0.1:5000/#/?workflowType=machine_learning (its training view)"
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(ML_LIFECYCLE_HOME)/mlflow/mlflow.db \
	  --host 127.0.0.1 --port 5000

bench: $(ENV_STAMP)
	$(BIN)/python -m benchmarks

lineage: ARGS ?= model
lineage: $(ENV_STAMP)
	$(BIN)/python -m cli.lineage $(ARGS)

lint: $(ENV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pyright

# PyPI's torch for Linux is the CUDA build (GBs of nvidia-* wheels); the lock holds the CPU build
# (torch==X+cpu), which uv takes from the wheels in UV_FIND_LINKS as long as the version there is
# the one pyproject.toml asks for. The lock is resolved into a copy (uv keeps the pins it reads
# from its output: nothing changed, nothing moves) and replaces requirements.lock only if torch is
# still the CPU build and no CUDA library came in; otherwise the old lock stays, with the reason.
LOCK_DRAFT := $(VENV)/requirements.lock.draft
lock: $(ENV_STAMP)
	cp requirements.lock $(LOCK_DRAFT)
	$(BIN)/uv pip compile pyproject.toml --extra dev --python-version 3.11 \
	  --generate-hashes --no-header --quiet -o $(LOCK_DRAFT)
	@if ! grep -q '^torch==[^ ]*+cpu ' $(LOCK_DRAFT) || grep -q '^nvidia-' $(LOCK_DRAFT); then \
	  echo "make lock: torch resolved to $$(grep -o '^torch==[^ ]*' $(LOCK_DRAFT)), not its CPU" \
	    "build (+cpu): UV_FIND_LINKS ($(UV_FIND_LINKS)) has no torch CPU wheel of the version" \
	    "pyproject.toml asks for ($$(grep -o 'torch==[^\"]*' pyproject.toml)). Put that wheel" \
	    "(download.pytorch.org/whl/cpu) there; requirements.lock is unchanged." >&2; \
	  rm -f $(LOCK_DRAFT); exit 1; \
	fi
	@# Unchanged, the lock keeps its time: the next make does not sync .venv again for nothing.
	@if cmp -s $(LOCK_DRAFT) requirements.lock; then rm $(LOCK_DRAFT); \
	  else mv $(LOCK_DRAFT) requirements.lock; fi

clean:
	rm -rf .local
