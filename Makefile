# slotplan: every target does its own set-up (idempotent) on a fresh machine.
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.deps-installed
SLOTPLAN:= $(VENV)/bin/slotplan

.PHONY: install lattigo demo test lint bench golden clean

install: $(STAMP) lattigo

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Builds the Lattigo extension with gopy into .venv (skips when up to date).
lattigo: $(STAMP)
	bash backends/lattigo/build.sh

demo: install
	$(SLOTPLAN) plan data/workloads/conv2.json --params n16 -o $(VENV)/demo-plan.json --tables $(VENV)/demo-tables.npz
	$(SLOTPLAN) run $(VENV)/demo-plan.json --tables $(VENV)/demo-tables.npz --backend sim --seed 1

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: install lint
	$(VENV)/bin/pytest

golden: install
	$(SLOTPLAN) golden

bench: install
	$(SLOTPLAN) bench data/suites/metakernel.json --params n16

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
