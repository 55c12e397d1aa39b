# synthbatch developer entry points. Everything installs itself; run as root on Debian 12.
PYTHON ?= python3
export PYTHON  # scripts/serving-env makes its venvs with it too
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install testbed testbeds serving-llamacpp serving-vllm serving-sglang client-dd \
	test-image demo test test-fast lint bundle bench clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	# PyPI's control (python-control), for the test that installs it beside synthbatch
	$(BIN)/pip download --quiet --no-deps --only-binary=:all: --dest $(VENV)/test-wheels \
		'control==0.10.2'
	touch $(STAMP)

install: $(STAMP)  ## create .venv with synthbatch (editable) and the test tools

NOACCT_DIR  ?= /tmp/synthbatch-testbed-noacct
NOACCT_PORT ?= 6917
# the second testbed also has a small MaxArraySize: runs of more shards split into several arrays
NOACCT_MAX_ARRAY_SIZE ?= 4
# the third: 3 nodes, each at its own loopback address (replicas that span nodes)
MULTINODE_DIR  ?= /tmp/synthbatch-testbed-multinode
MULTINODE_PORT ?= 7017
MULTINODE_FIRST_JOB_ID ?= 300

testbed:  ## start the local Slurm testbed (installs Slurm, munge, MariaDB if missing)
	scripts/slurm-testbed up >/dev/null

testbeds: testbed  ## the main testbed, one without accounting, one of 3 distinct nodes (for tests)
	SYNTHBATCH_TESTBED_ACCOUNTING=0 SYNTHBATCH_TESTBED_PORT=$(NOACCT_PORT) \
		SYNTHBATCH_TESTBED_MAX_ARRAY_SIZE=$(NOACCT_MAX_ARRAY_SIZE) \
		scripts/slurm-testbed up $(NOACCT_DIR) >/dev/null
	SYNTHBATCH_TESTBED_ACCOUNTING=0 SYNTHBATCH_TESTBED_NODES=3 SYNTHBATCH_TESTBED_DISTINCT_ADDRS=1 \
		SYNTHBATCH_TESTBED_PORT=$(MULTINODE_PORT) \
		SYNTHBATCH_TESTBED_FIRST_JOB_ID=$(MULTINODE_FIRST_JOB_ID) \
		scripts/slurm-testbed up $(MULTINODE_DIR) >/dev/null

serving-llamacpp:  ## serving environment: llama.cpp (xllamacpp) + SmolLM2-135M GGUF (~8 s)
	scripts/serving-env llamacpp >/dev/null

serving-vllm:  ## serving environment: vLLM CPU + SmolLM2 as safetensors (~3.5 GB, ~2 min)
	scripts/serving-env vllm >/dev/null

serving-sglang: serving-vllm  ## SGLang 0.5.23's argument parser on the vLLM env (~40 MB, ~20 s)
	scripts/serving-env sglang >/dev/null

# The sealed test image the real-container tests run (docs/containers.md): Debian trixie
# minbase + python3 (3.13) from Debian, nothing of synthbatch; built once, then cached.
TEST_IMAGE_DIR ?= $(CURDIR)/.work/images/python3-trixie
export SYNTHBATCH_TEST_IMAGE_DIR := $(TEST_IMAGE_DIR)

test-image:  ## sealed test image for charliecloud: rootfs/ + image.sqfs (~1 min once, cached)
	scripts/test-image $(TEST_IMAGE_DIR) >/dev/null

client-dd:  ## client environment: data-designer 0.9.7 (NeMo Data Designer, ~800 MB, ~1 min)
	scripts/client-env dd >/dev/null

# scripts/demo starts the testbed itself, or (no root, no apt-get) runs on the local backend
demo: install serving-llamacpp  ## examples/qa-dataset.toml end to end: a real Q/A/grade dataset
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/demo

# The fast suite waits more than it computes: 4 workers on 2 cores take it from ~56 s to ~25 s.
FAST_WORKERS ?= 4

test: install  ## every test: fast suite, then real-Slurm and real-engine suites
	$(BIN)/python -m pytest -m "not slurm and not slow" -n $(FAST_WORKERS)
	$(MAKE) --no-print-directory testbeds serving-llamacpp serving-vllm serving-sglang client-dd \
		test-image
	. scripts/testbed-env && $(BIN)/python -m pytest -m "slurm or slow"

test-fast: install  ## unit, contract and packaging tests (no Slurm)
	$(BIN)/python -m pytest -m "not slurm and not slow" -n $(FAST_WORKERS)

lint: install
	$(BIN)/ruff check .

bench: install  ## the performance suite: every benchmark in turn -> benchmarks/results/latest.json (docs/performance.md)
	$(VENV)/bin/python -m benchmarks all $(BENCH_ARGS)

bundle: install  ## build dist/agent-<sha256>.pyz and check it
	$(BIN)/python build_zipapp.py --check

clean:
	rm -rf $(VENV) dist build *.egg-info
