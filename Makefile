PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test install lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

install: $(VENV)/.installed

test: install
	$(BIN)/python -m pytest -q tests

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
