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
DEMO_TARGET ?= results/synth/vsepp.json

.PHONY: demo test venv clean report repro mlflow-ui

$(BIN)/xmr: requirements.txt pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

venv: $(BIN)/xmr

demo: venv
	@start=$$(date +%s); \
	$(BIN)/snakemake --cores $(CORES) $(DEMO_TARGET) && \
	$(BIN)/xmr show $(DEMO_TARGET) && \
	echo "demo finished in $$(( $$(date +%s) - start )) s"

test: venv
	$(BIN)/python -m pytest -q

repro: venv
	$(BIN)/dvc repro

mlflow-ui: venv
	$(BIN)/mlflow ui --host 127.0.0.1 --port 5000 --backend-store-uri sqlite:///mlflow.db

clean:
	rm -rf data features runs results logs reports .snakemake mlflow.db mlruns
