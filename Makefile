# specwatch developer entry points. `make check` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch; a GPU machine may install its CUDA build of the same release instead.
TORCH_SPEC ?= torch==2.13.0
export OMP_NUM_THREADS := 1

.PHONY: install check test lint bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e '.[suite,dev]'
	touch $@

install: $(BIN)/.installed

check: install
	$(BIN)/specwatch check --target reference

test: install lint
	$(BIN)/pytest -n 2 --dist loadgroup

lint: install
	$(BIN)/ruff check service workers migrations tests bench
	$(BIN)/ruff format --check service workers migrations tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: install
	$(BIN)/python bench/suite_power.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
