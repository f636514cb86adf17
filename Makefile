# The commands. Each creates .venv and installs what it needs on first use.
#   make demo   train the demo variants on the embedded corpus and print the comparison
#   make test   run the test suite
#   make wheelhouse [WHEEL_PYTHON=3.12]   wheels of every dependency but torch, for an offline GPU node (docs/running.md)
#   make lock   refresh requirements/lock.txt (the exact versions make installs) from pyproject.toml's ranges
#   make install-check   the wheel beside a current Hugging Face stack: nothing moves down; commands from another folder (minutes)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install wheelhouse lock install-check
WHEEL_PYTHON ?= 3.12
# the tested set: exact versions of every package (constraints); pyproject.toml holds the ranges
LOCK := requirements/lock.txt
EXTRAS := dev,hf,eval,wandb,float8,lm-eval

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first and pinned: a CPU wheel where one is available locally, never an unpinned CUDA build.
$(VENV)/.installed: $(BIN)/activate pyproject.toml setup.py $(LOCK)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[$(EXTRAS)]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python scripts/demo.py

test: install
	$(BIN)/python -m pytest -q -n auto --dist loadfile

install-check:
	bash .ci/install_check

wheelhouse: install
	$(BIN)/python scripts/wheelhouse.py wheelhouse --python-version $(WHEEL_PYTHON)

# The newest versions the ranges allow (requirements/lock.in's choices aside), resolved in a fresh venv.
lock:
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet --upgrade pip
	.lock-venv/bin/pip install --quiet torch==2.13.0
	.lock-venv/bin/pip install --quiet -c requirements/lock.in -e '.[$(EXTRAS)]'
	(echo '# make lock: every package make installs, exactly (torch first, from the Makefile). Edit pyproject.toml, not this.'; \
	 .lock-venv/bin/pip freeze --exclude-editable | sed 's/+cpu$$//') > $(LOCK)
	rm -rf .lock-venv
