# counterfactual: `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# What each target installs, once (a stamp per set): the demo needs only the package with its
# demo and ray extras (no torch, no models); real runs, eval and models add torch and every
# extra; the tests, lint and benchmarks add the dev extra's test stack on top.
DEMO_STAMP := $(VENV)/.installed-demo
DOCS_STAMP := $(VENV)/.installed-docs
RUN_STAMP := $(VENV)/.installed-all
STAMP := $(VENV)/.installed-dev
# torch and a torchvision built for it, installed first so no other package picks a torch.
# torchvision must match torch: PyPI's torchvision beside another torch build fails at import
# (and then transformers cannot load OWLv2). Unset, TORCH is what counterfactual/torch_build.py
# picks for this host from its NVIDIA driver (nvidia-smi): PyPI's 2.14.1 pair (CUDA 13.0, R580+,
# and without a GPU, as it runs on a CPU too), the CUDA 12.6 pair for R525-R575, aarch64's CPU
# pair; otherwise it stops with one line naming the TORCH= to set (README: "The right torch").
TORCH ?=
DATASET ?= demo
# a bundled config by name (`counterfactual configs` lists them) or a YAML file
CONFIG ?= $(DATASET)
# the demo runs in-process (a second or two; RUNNER=ray shows the same run on Ray)
RUNNER ?= $(if $(filter demo,$(DATASET)),local,ray)
IMAGE ?=
TEXT ?=
OUT ?= out/$(DATASET)$(if $(IMAGE),-$(IMAGE))$(if $(TEXT),-$(TEXT))
ROOT ?=
DOWNLOAD ?= 1
ARGS ?=
# make eval: MODEL is one or more specs (hf-clip:ID_OR_PATH, blip:..., open_clip:ARCH:TAG).
MODEL ?=
QUERIES ?=
EVAL_OUT ?= out/$(DATASET)-eval
# the test split the ODmAP queries are made from (docs/metrics.md); the demo uses all its images
TEST_SPLIT_coco = --coco-set val2014 --split-file $(ROOT)/dataset_coco.json --split test
TEST_SPLIT_flickr30k = --split test

# Nothing in the demo, the tests or the benchmarks reaches the network: OFFLINE is set on
# those commands only. A real run may download (`make models` fetches on purpose first).
export HF_HUB_DISABLE_TELEMETRY ?= 1
export RAY_USAGE_STATS_ENABLED ?= 0
OFFLINE := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
DEMO_OFFLINE = $(if $(filter demo,$(DATASET)),$(OFFLINE))
# make test: pytest-xdist workers (auto: one per core); each test file runs whole on one worker,
# so its module fixtures (a Ray, tiny models, a generated COCO) are built once (tests/conftest.py)
WORKERS ?= auto
PARALLEL = $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadfile)
# The package's bytecode, brought up to date before the targets that start Python processes.
# An editable install ships no .pyc (pip compiles a wheel's, not a source tree's), and where
# PYTHONDONTWRITEBYTECODE is set (CI, many Docker images) Python never writes one itself: every
# CLI, Ray worker and test process then compiles each module it imports again (0.2 s per start).
# compileall writes regardless of that variable and skips the files that are current; a file
# that does not compile is left to pytest to report, with its test. (pytest's own rewritten
# bytecode of the test modules is written by the test processes: tests/conftest.py.)
BYTECODE = $(BIN)/python -m compileall -q counterfactual tests benchmarks >/dev/null || true
# make experiment: where and how many seeds
EXP_OUT ?= out/experiment
SEEDS ?= 3
# make models: TO=DIR puts the models in a folder instead of the Hugging Face cache
TO ?=

.DEFAULT_GOAL := help
.PHONY: help install models synth eval data test test-fast gpu-check lint format bench experiment docs clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) && $(BIN)/pip install -q --upgrade pip

$(DEMO_STAMP): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/pip install -q -e ".[demo,ray]"
	touch $@

$(RUN_STAMP): pyproject.toml setup.py | $(BIN)/python
	@torch='$(TORCH)'; [ -n "$$torch" ] || torch="$$($(PYTHON) counterfactual/torch_build.py)" \
		|| exit 2; echo "torch for this host: $$torch"; $(BIN)/pip install -q $$torch
	$(BIN)/pip install -q -e ".[all]"
	touch $@

$(STAMP): $(RUN_STAMP)
	$(BIN)/pip install -q -e ".[all,dev]"
	touch $@

install: $(STAMP) ## create .venv and install the package with every extra and the test stack (torch first)

models: $(RUN_STAMP) ## fetch the models a config names: DATASET=coco|coco-rorem|... [TO=DIR ARGS="synth options"]
	$(BIN)/counterfactual models pull --config $(CONFIG) $(if $(TO),--to '$(TO)') $(if $(ARGS),-- $(ARGS))

synth: $(if $(filter demo,$(DATASET)),$(DEMO_STAMP),$(RUN_STAMP)) ## make shards (the demo in-process, the rest on Ray): DATASET=demo|coco|coco-rorem|flickr30k|wds|parquet|csv|files [ROOT= OUT= IMAGE= TEXT= RUNNER=ray|local ARGS=]
	$(DEMO_OFFLINE) $(BIN)/counterfactual synth --config $(CONFIG) --runner $(RUNNER) --out $(OUT) \
		$(if $(ROOT),--root '$(ROOT)') $(if $(IMAGE),--image-method $(IMAGE)) \
		$(if $(TEXT),--text-method $(TEXT)) $(ARGS)

eval: $(RUN_STAMP) ## ODmAP@k + R@K report: MODEL="spec ..." [DATASET= ROOT= QUERIES= EVAL_OUT= ARGS=]
	@test -n "$(MODEL)" || { echo "make eval needs MODEL=hf-clip:ID_OR_PATH (or blip:..., open_clip:ARCH:TAG)"; exit 2; }
	$(if $(QUERIES),,$(DEMO_OFFLINE) $(BIN)/counterfactual synth --config $(CONFIG) --runner $(RUNNER) \
		--out $(EVAL_OUT)/queries $(if $(ROOT),--root $(ROOT)) $(TEST_SPLIT_$(DATASET)))
	$(DEMO_OFFLINE) $(BIN)/counterfactual eval --dataset $(DATASET) --queries $(or $(QUERIES),$(EVAL_OUT)/queries) \
		--out $(EVAL_OUT)/report $(if $(ROOT),--root $(ROOT)) $(foreach m,$(MODEL),--model $(m)) $(ARGS)

data: $(DEMO_STAMP) ## fetch and verify the official files: DATASET=coco|flickr30k [ROOT=data/DATASET DOWNLOAD=0 lists only]
	$(BIN)/counterfactual data --dataset $(DATASET) --root $(or $(ROOT),data/$(DATASET)) \
		$(if $(filter 1 yes true,$(DOWNLOAD)),--download) $(ARGS)

test: $(STAMP) ## the offline test suite, in parallel [WORKERS=auto|N|0: pytest-xdist workers, 0 runs in-process]
	@$(BYTECODE)
	$(OFFLINE) $(BIN)/python -m pytest -q $(PARALLEL)

test-fast: $(STAMP) ## the suite without the slow (model-loading, end-to-end) tests [WORKERS=]
	@$(BYTECODE)
	$(OFFLINE) $(BIN)/python -m pytest -q $(PARALLEL) -m "not slow"

gpu-check: $(STAMP) ## every model path on CUDA with tiny models [CF_GPU_INPAINT_MODEL=real weights: a 50-image run, images/s]
	$(BIN)/python -m pytest -q -s -m gpu tests/test_gpu.py

lint: $(STAMP) ## check style (ruff)
	$(BIN)/ruff check counterfactual tests benchmarks setup.py
	$(BIN)/ruff format --check counterfactual tests benchmarks setup.py

format: $(STAMP) ## fix style (ruff)
	$(BIN)/ruff check --fix counterfactual tests benchmarks setup.py
	$(BIN)/ruff format counterfactual tests benchmarks setup.py

bench: $(STAMP) ## speed figures as ratios; writes benchmarks/latest.json
	$(OFFLINE) $(BIN)/python benchmarks/bench.py --out benchmarks/latest.json $(ARGS)

experiment: $(STAMP) ## the controlled world, D vs D ∪ D' from scratch on CPU: results.json/png/md [EXP_OUT=out/experiment SEEDS=3 ARGS=]
	$(OFFLINE) $(BIN)/counterfactual experiment --out $(EXP_OUT) --seeds $(SEEDS) $(ARGS)
	@cat $(EXP_OUT)/results.md

# the docs extra only (mkdocs, its theme); the options page is generated from the parsers first
$(DOCS_STAMP): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/pip install -q -e ".[docs]"
	touch $@

docs: $(DOCS_STAMP) ## the documentation site into site/ (mkdocs --strict: a broken link fails); regenerates docs/reference-options.md
	$(BIN)/python docs/gen_options.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

clean: ## remove generated output (keeps .venv)
	rm -rf out site .pytest_cache .ruff_cache
