# peertrain: two commands do everything.
#   make demo [PEERS=N] [PORT=8000]   set up, start the relay with the default task, print the URL to join
#   make test                         set up, lint, run the whole test suite (browser tests included)
# Set-up runs on first use and is reused afterwards (stamps in .stamps/, downloads cached in .cache/).

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMPS := .stamps
PORT ?= 8000
PEERS ?= 0
PYTEST_ARGS ?=
TORCH_VENV := .venv-torch

RUNTIME_SOURCES := $(shell find runtime -name '*.py' -o -name '*.wgsl' 2>/dev/null)

.PHONY: setup demo test lint chromium nginx postgresql torch-env clean

setup: $(STAMPS)/venv chromium $(STAMPS)/npm wheels/pyodide-lock.json site/index.html

$(STAMPS)/venv: pyproject.toml
	@mkdir -p $(STAMPS)
	@python312=$$(scripts/find-python 3.12) && echo "using $$python312" && \
	  { [ -x $(PY) ] && $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' || $$python312 -m venv --clear $(VENV); }
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

chromium:
	@scripts/ensure-chromium

# nginx in front of the relay (tests/browser/test_nginx_browser.py); the tests skip, saying why, without it.
nginx:
	@scripts/ensure-nginx

# PostgreSQL for the store's tests on a database server (tests/conftest.py starts its own); they skip without it.
postgresql:
	@scripts/ensure-postgresql

$(STAMPS)/npm: web/package.json web/package-lock.json
	@mkdir -p $(STAMPS)
	cd web && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

wheels/pyodide-lock.json: $(STAMPS)/venv $(STAMPS)/npm $(RUNTIME_SOURCES) server/browser_assets/wheels.py server/browser_assets/assets.py
	$(PY) -m server.browser_assets.wheels

# The documentation site the relay serves at /docs: MkDocs (mkdocs.yml) over docs/, the README and BENCHMARKS.md,
# the HTTP API page from the relay's OpenAPI declarations; --strict fails on a broken link or a page off the nav.
DOCS_SOURCES := mkdocs.yml README.md BENCHMARKS.md scripts/mkdocs_hooks.py $(shell find docs -type f 2>/dev/null) \
	$(wildcard server/relay/*.py)
site/index.html: $(STAMPS)/venv $(DOCS_SOURCES)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# PyTorch (and transformers, which loads `peertrain export --format hf`) is a test oracle and benchmark anchor
# only; its CPU build exists for Python 3.11 here.
# When it cannot be installed, the parity tests skip and say why.
torch-env: $(STAMPS)/torch-transformers
$(STAMPS)/torch-transformers:
	@mkdir -p $(STAMPS)
	@python311=$$(scripts/find-python 3.11) && \
	  { [ -x $(TORCH_VENV)/bin/python ] || $$python311 -m venv $(TORCH_VENV); } && \
	  $(TORCH_VENV)/bin/python -m pip install --quiet torch==2.13.0 numpy transformers==4.57.1 safetensors \
	  && touch $@ \
	  || echo "warning: no PyTorch 3.11 environment; the PyTorch parity tests will be skipped"

lint: $(STAMPS)/venv $(STAMPS)/npm
	$(VENV)/bin/ruff check runtime server tests examples
	$(VENV)/bin/mypy runtime server
	cd web && npx --no-install eslint src eslint.config.js

# The default session: arithmetic with the char tokenizer, 3 units per round, 3 local epochs per unit at lr 0.007, 7
# passes (19 rounds). In the simulator over seeds 0-3: 199, 200, 200, 197 of 200 exact answers and 100, 100, 100, 99
# of the 100 one-digit sums a+b, ~35 s on 2 cores; in three browsers 199/200 and 100/100 in 115 s, where Pyodide's
# last bits make another draw (BENCHMARKS.md, "The demo", with the recipes tried).
DEMO_SESSION ?= --task arith --set tokenizer=char --set epochs=3 --set lr=0.007 --set session_final_lr_ratio=0.1 -k 3 --passes 7
# DEMO_ARGS: more `peertrain serve` options, e.g. DEMO_ARGS=--fresh to start the session over.
DEMO_ARGS ?=
demo: setup
	$(PY) -m server.cli serve --port $(PORT) $(DEMO_SESSION) $(if $(filter-out 0,$(PEERS)),--peers $(PEERS)) $(DEMO_ARGS)

# pytest exits with 5 when no test was collected (e.g. a -k filter); that is not a failure here.
test: setup torch-env nginx postgresql lint
	$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && { echo "pytest: no tests collected"; rc=0; }; exit $$rc

clean:
	rm -rf $(STAMPS) wheels wheels.new tests/artifacts site
