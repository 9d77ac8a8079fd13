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

# Until the mini recipe lands, the demo runs what exists: the RNN-T loss benchmark on
# its first reference shape and the accumulation benchmark (overhead, memory, exactness).
demo: $(VENV)/.installed
	$(BIN)/python tools/bench_rnnt_loss.py --shapes 8,150,40,256
	$(BIN)/python tools/bench_accumulation.py --micro-batches 16

test: $(VENV)/.installed
	$(BIN)/python -m pytest

lint: $(VENV)/.installed
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: $(VENV)/.installed
	$(BIN)/python tools/bench_rnnt_loss.py
	$(BIN)/python tools/bench_accumulation.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
