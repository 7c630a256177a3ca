# The README's two commands: `make demo` and `make test`. Everything else is a convenience.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MLFLOW_ENABLE_TELEMETRY := false
CORES ?= 2
# extra Snakemake flags for `make benchmark` (after a stop: --rerun-incomplete)
SNAKEMAKE_ARGS ?=
# one more worker than the 2 cores: the third runs while the others wait on the processes they start (2026-12-06)
TEST_WORKERS ?= 3
DEMO_TARGET ?= results/synth/dvse_demo.json results/synth/dvse_demo_fr.json
# the Snakemake targets `make sync` marks up to date; default: those of the dvc.lock stages that are present
DVC_TARGETS ?=
MLFLOW_HOST ?= 127.0.0.1
MLFLOW_PORT ?= 5000
# setuptools' notice on every editable install ("be careful with folders in your working directory with the same
# name as your package") is moot here, where that folder is the package: silenced by its message, nothing else
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation:UserWarning"

.PHONY: demo test venv clean report repro mlflow-ui mlflow-server sync pull test-fast slurm-dry-run benchmark

$(BIN)/xmr: requirements.txt pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	$(QUIET_EDITABLE) $(BIN)/pip install -q --no-deps -e .
	touch $@

venv: $(BIN)/xmr

demo: venv
	@start=$$(date +%s); \
	$(BIN)/snakemake --cores $(CORES) $(DEMO_TARGET) && \
	$(BIN)/xmr show $(DEMO_TARGET) --expect README.md#demo-synth && \
	echo "demo finished in $$(( $$(date +%s) - start )) s"

# three pytest-xdist workers, one file each at a time (module fixtures built once); tests/conftest.py gives each
# worker one torch thread so that they do not spin against each other, and puts the longest files first:
# --no-loadscope-reorder keeps that order (xdist would hand out the files with the most tests first)
test: venv
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

# The seeded benchmarks on synth and the ladders (docs/benchmark.md), then the docs sections generated from them and
# the README's demo table
benchmark: venv
	$(BIN)/snakemake --cores $(CORES) $(SNAKEMAKE_ARGS) results/synth/benchmark.md results/synth/dvse_sets.md results/synth/baselines.md \
		reports/synth/results_page.md reports/synth/readme_demo.md \
		reports/synth/doc_ladders.md reports/synth/doc_dvse-sets.md reports/synth/doc_baselines.md

# the inner loop: everything but the tests marked slow (the integration tests: SLURM, DVC, MLflow server, browser,
# concurrency, Snakemake kills); `make test` runs them all, as CI does
test-fast: venv
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow"

repro: venv
	$(BIN)/dvc repro

# After `dvc pull`, `dvc checkout` or a git checkout: DVC restores files with new, unordered mtimes, and
# Snakemake would rebuild "updated" inputs' consumers; --touch marks the restored outputs up to date instead.
# (No venv prerequisite: it runs in fresh clones with the tools on PATH.)
sync:
	dvc checkout --allow-missing
	@targets="$(DVC_TARGETS)"; [ -n "$$targets" ] || targets=$$(python -m xmr dvc-targets) || exit 1; \
	if [ -z "$$targets" ]; then echo "no DVC stage outputs present: nothing to sync"; exit 0; fi; \
	echo "snakemake --touch --cores 1 $$targets"; snakemake --touch --cores 1 $$targets

pull: venv
	$(BIN)/dvc pull --allow-missing
	$(MAKE) sync

# The tracking server + UI (docs/tracking.md); MLFLOW_HOST=0.0.0.0 to serve compute nodes
mlflow-server: venv
	$(BIN)/xmr mlflow-server --host $(MLFLOW_HOST) --port $(MLFLOW_PORT)

mlflow-ui: mlflow-server

# What the SLURM profile would submit, without SLURM (docs/pipeline.md)
slurm-dry-run: venv
	$(BIN)/snakemake -n --profile slurm $(or $(TARGET),results/synth/vsepp.json)

clean:
	rm -rf data features runs results logs reports .snakemake mlflow.db mlruns mlartifacts dvc_plots
