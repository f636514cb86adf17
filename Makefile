# The commands. Each creates .venv and installs what it needs on first use.
#   make demo   train the demo variants on the embedded corpus and print the comparison; after an
#               interruption it continues the unfinished variants
#               (make demo DEMO_ARGS=--fresh: start over)
#   make test   run the test suite
#   make wheelhouse [WHEEL_PYTHON=3.12]   what the GPU run imports, <= 56 MiB, for an offline GPU
#               node (docs/gpu_checks.md); make wheelhouse-hf: and transformers for its generation
#               section, a folder apart
#   make lock   refresh requirements/lock.txt (the exact versions make installs) from
#               pyproject.toml's ranges
#   make install-check   the wheel beside a current Hugging Face stack: nothing moves down;
#               commands from another folder (minutes)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast test-install format install wheelhouse wheelhouse-hf lock install-check
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
	$(BIN)/python scripts/demo.py $(DEMO_ARGS)

# The suite, a worker per core and one more (a test waiting on its ranks or a process leaves its core
# to another), a file a worker. `make test-fast`: without the end-to-end tests (marked slow), for
# the edit loop. `make test-install`: the GPU run's offline install rehearsed (minutes of pip).
WORKERS ?= $(shell $(PYTHON) -c "import os; print(len(os.sched_getaffinity(0)) + 1)")
PYTEST = $(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile
test: install
	$(PYTEST) -m "not install"

test-fast: install
	$(PYTEST) -m "not slow and not install"

test-install: install
	$(BIN)/python -m pytest -q -m install

# the one style (CI runs ruff format --check . and ruff check .); ruff check names the lines over
# 100 columns that the formatter cannot wrap (comments, docstrings, strings): wrap those by hand
format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check .

install-check:
	bash .ci/install_check

# The offline install of scripts/gpu_check.py --wheelhouse (docs/gpu_checks.md): the wheels of what
# the acceptance run imports, at the lock's versions, for CPython WHEEL_PYTHON on glibc x86_64, and
# the project's own wheel, at most WHEEL_MIB. pip resolves 'hourglass-olmo[float8,liger]' and pytest
# for this Python (--dry-run --report: metadata only); left out are the node's torch and its stack
# (NODE_HAS: torch's own requirements) and what the run never imports (NOT_IMPORTED: OLMo-core's
# pandas, the project's matplotlib for figures and scipy for statistics, their dependencies;
# gpu_check.py installs with --no-deps). Liger's wheel is pure Python (the node's torch brings its triton); flash-attn and
# grouped_gemm have no wheel for the node's torch here: their rows say so (--allow-missing).
WHEELHOUSE ?= wheelhouse
WHEEL_PYTHON ?= 3.12
WHEEL_MIB ?= 56
MANYLINUX = manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1
WHEEL_TARGET = --only-binary=:all: --python-version $(WHEEL_PYTHON) --implementation cp \
	--abi cp$(subst .,,$(WHEEL_PYTHON)) --abi abi3 --abi none \
	$(foreach p,$(MANYLINUX),--platform $(p)_x86_64)
NODE_HAS = torch triton pytorch-triton hourglass-olmo sympy mpmath networkx jinja2 markupsafe \
	fsspec setuptools typing-extensions
NOT_IMPORTED = pandas pytz tzdata matplotlib contourpy cycler fonttools kiwisolver pillow \
	pyparsing hf-xet scipy
wheelhouse: install
	rm -rf $(WHEELHOUSE) && mkdir -p $(WHEELHOUSE)
	$(BIN)/python -m pip install --quiet --dry-run --ignore-installed \
		--report $(WHEELHOUSE)/resolved.json -c $(LOCK) '.[float8,liger]' pytest
	$(BIN)/python -c "import json, sys; print(*(f\"{m['name']}=={m['version']}\" \
		for m in (i['metadata'] for i in json.load(open(sys.argv[1]))['install']) \
		if m['name'].lower().replace('_', '-') not in sys.argv[2:] \
		and not m['name'].startswith(('nvidia-', 'cuda-'))), sep='\n')" \
		$(WHEELHOUSE)/resolved.json $(NODE_HAS) $(NOT_IMPORTED) > $(WHEELHOUSE)/requirements.txt
	$(BIN)/python -m pip download --quiet --no-deps $(WHEEL_TARGET) --dest $(WHEELHOUSE) \
		-r $(WHEELHOUSE)/requirements.txt
	$(BIN)/python -m pip wheel --quiet --no-deps --wheel-dir $(WHEELHOUSE) .
	rm $(WHEELHOUSE)/resolved.json
	@ls $(WHEELHOUSE)/*.whl | wc -l | xargs printf '$(WHEELHOUSE): %s wheels, '; \
		du -sh $(WHEELHOUSE) | cut -f1
	@test $$(du -sm $(WHEELHOUSE) | cut -f1) -le $(WHEEL_MIB) || \
		{ echo "$(WHEELHOUSE): over $(WHEEL_MIB) MiB"; exit 1; }

# The hf extra the GPU check's generation section needs (transformers, 14 MiB with what it adds to
# the wheelhouse): a folder of its own, carried in a second call (the checkout and the wheelhouse
# hold 58 of the 64 MiB a call carries) and installed as the wheelhouse is (docs/gpu_checks.md).
wheelhouse-hf: wheelhouse
	rm -rf $(WHEELHOUSE)-hf && mkdir -p $(WHEELHOUSE)-hf
	$(BIN)/python -m pip install --quiet --dry-run --ignore-installed \
		--report $(WHEELHOUSE)-hf/resolved.json -c $(LOCK) '.[float8,liger,hf]' pytest
	$(BIN)/python -c "import json, sys; have = {l.split('==')[0].lower() for l in \
		open(sys.argv[2]).read().split()}; print(*(f\"{m['name']}=={m['version']}\" \
		for m in (i['metadata'] for i in json.load(open(sys.argv[1]))['install']) \
		if m['name'].lower().replace('_', '-') not in [*sys.argv[3:], *have] \
		and m['name'].lower() not in have and not m['name'].startswith(('nvidia-', 'cuda-'))), \
		sep='\n')" $(WHEELHOUSE)-hf/resolved.json $(WHEELHOUSE)/requirements.txt $(NODE_HAS) \
		$(NOT_IMPORTED) > $(WHEELHOUSE)-hf/requirements.txt
	$(BIN)/python -m pip download --quiet --no-deps $(WHEEL_TARGET) --dest $(WHEELHOUSE)-hf \
		-r $(WHEELHOUSE)-hf/requirements.txt
	rm $(WHEELHOUSE)-hf/resolved.json
	@ls $(WHEELHOUSE)-hf/*.whl | wc -l | xargs printf '$(WHEELHOUSE)-hf: %s wheels, '; \
		du -sh $(WHEELHOUSE)-hf | cut -f1

# The newest versions the ranges allow (requirements/lock.in's choices aside), resolved in a fresh
# venv; and einops, flash-attn's one dependency besides torch (the gpu extra is built on the node:
# its dependencies come from the wheelhouse, at the lock's versions).
lock:
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet --upgrade pip
	.lock-venv/bin/pip install --quiet torch==2.13.0
	.lock-venv/bin/pip install --quiet -c requirements/lock.in -e '.[$(EXTRAS)]' einops
	(echo '# make lock: every package make installs, exactly (torch first, from the Makefile). '\
'Edit pyproject.toml, not this.'; \
	 .lock-venv/bin/pip freeze --exclude-editable | sed 's/+cpu$$//') > $(LOCK)
	rm -rf .lock-venv
