# Two entry points (see README): `make demo` and `make test`.
# Everything runs inside .venv at the repo root, built from constraints.txt (the lock), except
# `make gpu-check`, which runs on the GPU machine's own python.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LOCK := constraints.txt
STAMP := $(VENV)/.requirements-hash
# Every pip call, including isolated builds, keeps torch/numpy at the locked versions:
# an unconstrained resolve pulls the CUDA torch wheels and numpy 2 (which fairseq cannot use).
export PIP_CONSTRAINT := $(abspath $(LOCK))
export PIP_DISABLE_PIP_VERSION_CHECK := 1
REQ_HASH := $(shell cat $(LOCK) setup.cfg pyproject.toml | sha256sum | cut -c1-16)
PYTEST_ARGS ?=
# pytest-xdist workers for make test (CI has 2 cores; 0 runs in this process; docs/developing.md).
PYTEST_WORKERS ?= 2
PYTEST = -m pytest -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder --timeout 900 $(PYTEST_ARGS)
DEMO_ARGS ?=
GPU_CHECK_ARGS ?=

.PHONY: venv lint test demo bench gpu-check triton-carry device-torch-test latest-test lock clean cells-doc

venv:
	@if [ "$$(cat $(STAMP) 2>/dev/null)" != "$(REQ_HASH)" ]; then \
		$(MAKE) --no-print-directory _build-venv; \
	else echo ".venv is up to date"; fi

# $(call build-venv,DIR,PYTHON,TORCH,CONSTRAINTS,EXTRAS,TEST_EXTRA) makes the venv DIR with PYTHON:
# the requirement TORCH first (before anything that depends on it, so that pip takes that wheel), fairseq-fixed
# with --no-deps (its metadata pulls a CUDA torchaudio that breaks torch and transformers; its
# import-time dependencies and numpy<2 come with setup.cfg's `fairseq` extra), then this package with
# EXTRAS and TEST_EXTRA, all under the lock CONSTRAINTS.
define build-venv
rm -rf $(1)
$(2) -m venv $(1)
export PIP_CONSTRAINT=$(abspath $(4)); \
$(1)/bin/pip install -q '$(3)' numpy cython setuptools wheel \
&& $(1)/bin/pip install -q --no-deps --no-build-isolation fairseq-fixed==0.12.3.1 \
&& $(1)/bin/pip install -q --no-build-isolation -e '.[$(5),$(6)]'
$(1)/bin/python -c "import torch, fairseq, transformers, accelerate; print('torch', torch.__version__, '| fairseq', fairseq.__version__, '| transformers', transformers.__version__)"
endef

TORCH := 2.13.0
# What the suite imports; `test` adds its tools and the interpreter's Triton (setup.cfg).
RUNTIME_EXTRAS := hf,recipes,fairseq,peft,export,eval
_build-venv:
	$(call build-venv,$(VENV),$(PYTHON),torch==$(TORCH),$(LOCK),$(RUNTIME_EXTRAS),test)
	echo "$(REQ_HASH)" > $(STAMP)

# ruff's configuration is in pyproject.toml ([tool.ruff]).
lint: venv
	$(BIN)/ruff check .

test: venv lint
	$(BIN)/python $(PYTEST)

# The main job: momentum vs baseline LMs on the offline Austen corpus through fairseq-train.
demo: venv
	$(BIN)/python -m recipes.demo.run $(DEMO_ARGS)

bench: venv
	$(BIN)/python benchmarks/attention.py

# docs/cells.md from the cell table (tests/test_rnn_layout.py fails while the two differ).
cells-doc: venv
	$(BIN)/python -c "from plugins.rnn.variants import cells_markdown; print(cells_markdown(), end='')" \
		> docs/cells.md

# On a CUDA machine, offline, in at most 8 minutes on an H100 (one device call): the gpu-marked
# tests, attention, RNN and HF benchmarks, one dated section in docs/benchmarks.md
# (benchmarks/gpu_check.py; finished parts are cached in outputs/gpu-check/). No .venv: its torch
# is a CPU wheel; the machine's python has CUDA.
# GPU_CHECK_ARGS="--device cpu" is the tiny dry run, "--force" reruns cached parts.
gpu-check:
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(PYTHON) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

# The GPU machine's Triton cache, built here for its Triton (3.6.0 under Python 3.12) with the cp311
# wheel of the same release under the cp312 wheel's key; the next device call carries .triton-carry
# (benchmarks/triton_cache_prebuild.py, docs/developing.md). Needs a Python 3.12 (pyenv's, or
# DEVICE_PYTHON=...) and PyPI; about 11 minutes on 2 cores (one build process per core).
DEVICE_TRITON := 3.6.0
DEVICE_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) $(shell command -v python3.12))
TRITON_BUILD := build/device-triton
PREBUILD_ARGS ?=
triton-carry: venv
	@test -n "$(DEVICE_PYTHON)" || { echo "make triton-carry: no Python 3.12 found; set DEVICE_PYTHON"; exit 1; }
	for py in 3.11 3.12; do \
		PIP_CONSTRAINT= $(BIN)/pip download -q --no-deps --only-binary=:all: --python-version $$py \
			--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
			-d $(TRITON_BUILD)/wheels triton==$(DEVICE_TRITON) || exit 1; \
		tag=cp$$(echo $$py | tr -d .); rm -rf $(TRITON_BUILD)/$$tag; \
		unzip -q $(TRITON_BUILD)/wheels/triton-$(DEVICE_TRITON)-$$tag-*.whl -d $(TRITON_BUILD)/$$tag || exit 1; \
	done
	$(BIN)/python benchmarks/triton_cache_prebuild.py --site $(TRITON_BUILD)/cp311 \
		--device-python $(DEVICE_PYTHON) --device-site $(TRITON_BUILD)/cp312 --out .triton-carry --check $(PREBUILD_ARGS)

# The whole suite on the GPU machine's torch (2.11, setup.cfg's floor; PyPI's CUDA build, 3 GB to
# download and 6 GB installed, runs on the CPU), with everything else at the lock's versions. Its Triton
# is the lock's: the tests run the kernels through Triton's interpreter, which the machine's Triton 3.6
# cannot (plugins/triton_launch.py, INTERPRETER_FLOOR); 3.6 compiles them in `make triton-carry`. torch
# 2.11 pins Triton 3.6, so the venv takes the `test-tools` extra (not `test`, which asks Triton >= 3.8)
# and then the lock's Triton with --no-deps.
# About 20 minutes on 2 cores (pytest 18 of them).
DEVICE_TORCH := 2.11.0
DEVICE_VENV := build/device-torch
DEVICE_LOCK := build/device-torch-constraints.txt
device-torch-test:
	@test -n "$(DEVICE_PYTHON)" || { echo "make device-torch-test: no Python 3.12 found; set DEVICE_PYTHON"; exit 1; }
	mkdir -p build
	grep -v -e '^torch==' -e '^triton==' $(LOCK) > $(DEVICE_LOCK)
	echo "torch==$(DEVICE_TORCH)" >> $(DEVICE_LOCK)
	$(call build-venv,$(DEVICE_VENV),$(DEVICE_PYTHON),torch==$(DEVICE_TORCH),$(DEVICE_LOCK),$(RUNTIME_EXTRAS),test-tools)
	$(DEVICE_VENV)/bin/pip install -q --no-deps $$(grep '^triton==' $(LOCK))
	$(DEVICE_VENV)/bin/python -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__)"
	PATH=$(abspath $(DEVICE_VENV))/bin:$$PATH $(DEVICE_VENV)/bin/python $(PYTEST)

# The whole suite on the newest releases that setup.cfg admits, as pip resolves them for a user today
# (no lock): the newest torch (PyPI's CUDA build, which runs on the CPU; about 3 GB to download) with
# the Triton it pins, and the newest transformers, accelerate, peft, datasets, hub...; fairseq-fixed as
# always, and numpy<2 for it. Run it when they release (docs/developing.md). A pip config that caps
# torch or points at a local wheel (this workplace's /etc/xdg/pip) is lifted with PIP_CONFIG_FILE=/dev/null.
LATEST_VENV := build/latest
LATEST_TORCH ?= torch
latest-test:
	mkdir -p build
	echo "numpy<2" > build/latest-constraints.txt
	$(call build-venv,$(LATEST_VENV),$(PYTHON),$(LATEST_TORCH),build/latest-constraints.txt,$(RUNTIME_EXTRAS),test)
	$(LATEST_VENV)/bin/pip list 2>/dev/null | grep -i -E '^(torch|triton|transformers|accelerate|peft|datasets|huggingface.hub) '
	PATH=$(abspath $(LATEST_VENV))/bin:$$PATH $(LATEST_VENV)/bin/python $(PYTEST)

# Re-resolve and rewrite the lock from what is installed in .venv (then commit it).
lock: venv
	$(BIN)/pip freeze --exclude-editable | grep -v -e '^-e' -e '^momentum-plugins' \
		| sed -e 's/^torch==.*/torch==$(TORCH)/' > $(LOCK).new
	mv $(LOCK).new $(LOCK)

clean:
	rm -rf $(VENV) build *.egg-info
