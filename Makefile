# counterfactual: `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch and a torchvision built for it, installed first so no other package picks a torch.
# torchvision must match torch: PyPI's torchvision beside another torch build fails at import
# (and then transformers cannot load OWLv2). x86_64: PyPI's 2.14.1 pair (it also runs on a CPU);
# aarch64: PyPI's CPU pair. On a GPU host set TORCH to the builds you want.
TORCH ?= $(if $(filter aarch64 arm64,$(shell uname -m)),torch==2.9.1 torchvision==0.24.1,torch==2.14.1 torchvision==0.29.1)

DATASET ?= demo
CONFIG ?= pipelines/configs/$(DATASET).yaml
RUNNER ?= ray
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
# the test split the ODmAP queries are made from (SPEC 1.5); the demo uses all its images
TEST_SPLIT_coco = --coco-set val2014 --split-file $(ROOT)/dataset_coco.json --split test
TEST_SPLIT_flickr30k = --split test

# Nothing in the offline demo, the tests or the benchmarks reaches the network.
export HF_HUB_OFFLINE ?= 1
export HF_HUB_DISABLE_TELEMETRY ?= 1
export RAY_USAGE_STATS_ENABLED ?= 0

.DEFAULT_GOAL := help
.PHONY: help install synth eval data test test-fast gpu-check lint format bench clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[all,dev]"
	touch $(STAMP)

install: $(STAMP) ## create .venv and install the package with every extra (torch first)

synth: $(STAMP) ## make shards on Ray: DATASET=demo|coco|flickr30k|wds|parquet|csv|files [ROOT= OUT= IMAGE= TEXT= RUNNER=ray|local ARGS=]
	$(BIN)/counterfactual synth --config $(CONFIG) --runner $(RUNNER) --out $(OUT) \
		$(if $(ROOT),--root '$(ROOT)') $(if $(IMAGE),--image-method $(IMAGE)) \
		$(if $(TEXT),--text-method $(TEXT)) $(ARGS)

eval: $(STAMP) ## ODmAP@k + R@K report: MODEL="spec ..." [DATASET= ROOT= QUERIES= EVAL_OUT= ARGS=]
	@test -n "$(MODEL)" || { echo "make eval needs MODEL=hf-clip:ID_OR_PATH (or blip:..., open_clip:ARCH:TAG)"; exit 2; }
	$(if $(QUERIES),,$(BIN)/counterfactual synth --config $(CONFIG) --runner $(RUNNER) \
		--out $(EVAL_OUT)/queries $(if $(ROOT),--root $(ROOT)) $(TEST_SPLIT_$(DATASET)))
	$(BIN)/counterfactual eval --dataset $(DATASET) --queries $(or $(QUERIES),$(EVAL_OUT)/queries) \
		--out $(EVAL_OUT)/report $(if $(ROOT),--root $(ROOT)) $(foreach m,$(MODEL),--model $(m)) $(ARGS)

data: $(STAMP) ## fetch and verify the official files: DATASET=coco|flickr30k [ROOT=data/DATASET DOWNLOAD=0 lists only]
	$(BIN)/counterfactual data --dataset $(DATASET) --root $(or $(ROOT),data/$(DATASET)) \
		$(if $(filter 1 yes true,$(DOWNLOAD)),--download) $(ARGS)

test: $(STAMP) ## the offline test suite
	$(BIN)/python -m pytest -q

test-fast: $(STAMP) ## the suite without the slow (model-loading, end-to-end) tests
	$(BIN)/python -m pytest -q -m "not slow"

gpu-check: $(STAMP) ## every model path on CUDA with tiny models [CF_GPU_INPAINT_MODEL=real weights: a 50-image run, images/s]
	$(BIN)/python -m pytest -q -s -m gpu tests/test_gpu.py

lint: $(STAMP) ## check style (ruff)
	$(BIN)/ruff check counterfactual pipelines tests benchmarks
	$(BIN)/ruff format --check counterfactual pipelines tests benchmarks

format: $(STAMP) ## fix style (ruff)
	$(BIN)/ruff check --fix counterfactual pipelines tests benchmarks
	$(BIN)/ruff format counterfactual pipelines tests benchmarks

bench: $(STAMP) ## speed figures as ratios; writes benchmarks/latest.json
	$(BIN)/python benchmarks/bench.py --out benchmarks/latest.json $(ARGS)

clean: ## remove generated output (keeps .venv)
	rm -rf out .pytest_cache .ruff_cache
