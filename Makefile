# The two commands a newcomer runs (see README): `make demo` and `make test`.
# Each creates .venv with Python 3.11 and installs what it needs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# The main job: the mini recipe, from synthesising the corpus to the test-set WER.
# SEED picks another corpus (voices, held-out split, texts) and training seed; SET passes
# config overrides to training, e.g. make demo SET="model.loss=pruned".
SEED ?= 0
SET ?=
demo: $(VENV)/.installed
	ASRKIT=$(abspath $(BIN))/asrkit bash recipes/mini/run.sh --work exp/mini --seed $(SEED) $(foreach kv,$(SET),--set $(kv))

# Two worker processes, each test file in one of them (its module fixtures built once).
test: $(VENV)/.installed
	$(BIN)/python -m pytest -n 2 --dist loadfile

lint: $(VENV)/.installed
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: $(VENV)/.installed
	$(BIN)/python tools/bench_rnnt_loss.py
	$(BIN)/python tools/bench_accumulation.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
