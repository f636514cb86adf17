# The commands. Each creates .venv and installs what it needs on first use.
#   make demo   train the demo variants on the embedded corpus and print the comparison
#   make test   run the test suite
#   make wheelhouse [WHEEL_PYTHON=3.12]   wheels of every dependency but torch, for an offline GPU node (docs/running.md)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install wheelhouse
WHEEL_PYTHON ?= 3.12

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first and pinned: a CPU wheel where one is available locally, never an unpinned CUDA build.
$(VENV)/.installed: $(BIN)/activate setup.cfg pyproject.toml
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,hf,eval,wandb,float8]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python scripts/demo.py

test: install
	$(BIN)/python -m pytest -q -n auto --dist loadfile

wheelhouse: install
	$(BIN)/python scripts/wheelhouse.py wheelhouse --python-version $(WHEEL_PYTHON)
