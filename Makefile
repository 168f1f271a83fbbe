# Entry points: `make quickstart`, `make test` and `make test-fast` (no tests marked slow).
# Each builds .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch; set TORCH_SPEC=torch for your platform's default build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup quickstart test test-fast lint clean

$(BIN)/sweeps: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -c constraints.txt -e ".[test,lightning,huggingface,hydra]"
	touch $@

setup: $(BIN)/sweeps

quickstart: setup
	$(BIN)/sweeps run examples/direction.yaml

lint: setup
	$(BIN)/ruff check .

test: setup
	$(BIN)/ruff check .
	$(BIN)/pytest -q --durations=15

test-fast: setup
	$(BIN)/ruff check .
	$(BIN)/pytest -q -m "not slow"

clean:
	rm -rf $(VENV) results
