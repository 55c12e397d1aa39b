# synthbatch developer entry points. Everything installs itself; run as root on Debian 12.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install testbed demo test test-fast test-slurm lint bundle clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv with synthbatch (editable) and the test tools

NOACCT_DIR  ?= /tmp/synthbatch-testbed-noacct
NOACCT_PORT ?= 6917

testbed:  ## start the local Slurm testbeds: the main one, and one without accounting
	scripts/slurm-testbed up >/dev/null
	SYNTHBATCH_TESTBED_ACCOUNTING=0 SYNTHBATCH_TESTBED_PORT=$(NOACCT_PORT) \
		scripts/slurm-testbed up $(NOACCT_DIR) >/dev/null

demo: install testbed  ## run examples/quickstart.toml end to end on the local testbed
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/demo

test: install testbed  ## every test: fast suite, then real-Slurm and slow suites
	. scripts/testbed-env && $(BIN)/python -m pytest -m "not slurm and not slow"
	. scripts/testbed-env && $(BIN)/python -m pytest -m "slurm or slow"

test-fast: install  ## unit, contract and packaging tests (no Slurm)
	$(BIN)/python -m pytest -m "not slurm and not slow"

lint: install
	$(BIN)/ruff check .

bundle: install  ## build dist/agent-<sha256>.pyz and check it
	$(BIN)/python build_zipapp.py --check

clean:
	rm -rf $(VENV) dist build *.egg-info
