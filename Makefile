# Two commands do everything on a fresh machine:
#   make demo   set up .venv, then train the built-in demo and print its held-out accuracy
#   make test   set up .venv, then run the test suite (all of it, as CI does)
# and, while working, the unit tests alone (no processes, nothing slow; under 2 minutes):
#   make test-fast
# and one more for the vision + audio model:
#   make demo-audio   the same with spoken digits (needs espeak-ng, which setup installs)
# and one for the Qwen2.5-VL family (native-resolution images, video, M-RoPE):
#   make demo-qwen    digits at varying sizes, several per sample, and digit clips
# and one for the Qwen3-VL family (DeepStack, interleaved M-RoPE, timestamped clips):
#   make demo-qwen3   the same digits in 32 px cells, each clip's frames after their time
# and one for Qwen3.5 (the hybrid Gated DeltaNet + gated-attention LLM):
#   make demo-qwen35  the Qwen3-VL demo's data
# Every install takes the versions in requirements-lock.txt, the set the suite last passed
# with (pip's constraints file); pyproject.toml keeps the ranges a library user installs from.
#   make lock         rewrite the lock from the newest releases (then make test, then commit)
#   make test-latest  the suite on the newest releases, in .venv-latest (not CI): an upstream
#                     change shows here before a user meets it
# Python 3.11 or newer, as pyproject.toml's requires-python says (tested: 3.11 on CPU, as CI
# runs, and 3.12 on the GPU node); PYTHON=python3.12 picks another.
PYTHON_MIN := 3.11
PYTHON ?= python3.11
VENV   ?= .venv
# On a GPU machine pass the CUDA build you want, e.g. TORCH="torch==2.13.0 --index-url ...".
TORCH  ?= torch==2.13.0
PIP    := $(VENV)/bin/python -m pip
# The lock every install is constrained by; LOCK= (empty) installs the newest releases.
LOCK   ?= requirements-lock.txt
LOCKED := $(if $(LOCK),-c $(LOCK))
NPROC  ?= 2

.PHONY: demo demo-audio demo-qwen demo-qwen3 demo-qwen35 test test-fast test-latest lint setup \
	espeak-ng clean lock print-demo-flags gpu-wheels gpu-check

setup: $(VENV)/.installed espeak-ng

# espeak-ng (a Debian package, GPL-3.0, run as a program) speaks the audio demo's digits.
# Installed when missing and apt-get can run (root, or sudo without a password); otherwise
# say how, and only the audio demo and its data test need it.
espeak-ng:
	@command -v espeak-ng >/dev/null 2>&1 || \
	{ if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO="sudo -n"; fi; \
	  $$SUDO apt-get install -y -q espeak-ng >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null 2>&1 && \
	    $$SUDO apt-get install -y -q espeak-ng >/dev/null 2>&1; } || \
	  echo "note: espeak-ng is not installed (make demo-audio needs it): run" \
	       "'sudo apt-get install -y espeak-ng' (Debian/Ubuntu) or 'brew install espeak-ng'"; }

# torch first and pinned, so no later requirement pulls a different (CUDA) build.
# megatron-core alone goes in with --ignore-requires-python (why: pyproject.toml, at its pin;
# for everything, pip would pick releases that need 3.12 and build them from source); its
# own requirements come with the package's.
# mistral-common only ships the demo's SentencePiece tokenizer file: --no-deps.
# Every step is constrained by the lock, pip itself included.
$(VENV)/.installed: pyproject.toml $(LOCK)
	@$(PYTHON) -c 'import sys; v = tuple(map(int, "$(PYTHON_MIN)".split("."))); \
	  sys.exit(None if sys.version_info >= v else "megatron_mm needs Python >=$(PYTHON_MIN), " \
	           f"{sys.executable} is {sys.version.split()[0]}: set PYTHON=python3.12")'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(LOCKED) --upgrade pip
	$(PIP) install -q $(LOCKED) $(TORCH)
	$(PIP) install -q $(LOCKED) --no-deps --ignore-requires-python megatron-core==0.19.2
	$(PIP) install -q $(LOCKED) --no-deps --no-warn-conflicts mistral-common==1.13.1
	$(PIP) install -q $(LOCKED) --no-warn-conflicts -e ".[test,hf,energon]"
	echo "$(LOCK)" > $@

# A venv's packages as lock lines (the CPU build of torch named by its version alone).
freeze = $(1)/bin/python -m pip freeze --all --exclude-editable | grep -v '^\#' \
	| sed 's/^torch==\(.*\)+cpu$$/torch==\1/' | LC_ALL=C sort -f

# The lock from the newest releases pyproject.toml admits (torch and megatron-core stay at
# their pins): a fresh .venv-lock, frozen; the header comment is kept.
lock:
	rm -rf .venv-lock
	$(MAKE) --no-print-directory .venv-lock/.installed VENV=.venv-lock LOCK=
	{ grep '^#' requirements-lock.txt; $(call freeze,.venv-lock); } > requirements-lock.txt.new
	mv requirements-lock.txt.new requirements-lock.txt
	rm -rf .venv-lock
	-git diff --stat -- requirements-lock.txt

# The demos: typed configs in Python (megatron_mm/recipes/demos.py, docs/recipes.md), run
# by name; flags after --recipe override its values (make demo DEMO_FLAGS="--recipe demo
# --train-iters 100").

# The demo: CLIP-style ViT + MLP projector + Llama-style LLM on real handwritten digits,
# data-parallel over $(NPROC) processes (gloo on CPU, NCCL on GPUs).
DEMO_FLAGS = --recipe demo

demo: setup
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc-per-node $(NPROC) \
		examples/pretrain_mllm.py $(DEMO_FLAGS)

# The vision + audio demo: the ViT above plus a Whisper-style audio encoder, on handwritten
# digits paired with digits spoken by espeak-ng ("seven plus three is ten").
DEMO_AUDIO_FLAGS = --recipe demo_audio

demo-audio: setup
	@command -v espeak-ng >/dev/null 2>&1 || { echo "make demo-audio needs espeak-ng:" \
	  "sudo apt-get install -y espeak-ng (Debian/Ubuntu) or brew install espeak-ng"; exit 2; }
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc-per-node $(NPROC) \
		examples/pretrain_mllm.py $(DEMO_AUDIO_FLAGS)

# The Qwen2.5-VL demo: its ViT (14 px patches, 2x2 merger, window attention) at each
# image's own size + an M-RoPE LLM, on digit images of sides 28-84 px (the digit in every
# 28 px cell: 1-9 tokens), 1-3 per question, and on clips of 2 or 4 digit frames
# (families/qwen2_5_vl/digits.py); the pixel bounds keep every image and frame as it is drawn.
DEMO_QWEN_FLAGS = --recipe demo_qwen

demo-qwen: setup
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc-per-node $(NPROC) \
		examples/pretrain_mllm.py $(DEMO_QWEN_FLAGS)

# The Qwen3-VL demo: its ViT (16 px patches, a learned position table, attention within each
# frame) whose layer 0 also feeds DeepStack (added after LLM layer 0) + a Qwen3 LLM (q / k
# norms) with interleaved M-RoPE, on the digits above drawn in 32 px cells
# (families/qwen3_vl/digits.py); each clip's temporal patches follow their "<t seconds>" text.
DEMO_QWEN3_FLAGS = --recipe demo_qwen3

demo-qwen3: setup
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc-per-node $(NPROC) \
		examples/pretrain_mllm.py $(DEMO_QWEN3_FLAGS)

# The Qwen3.5 demo: Qwen3-VL's tower without DeepStack + a hybrid LLM (layers 0 and 2 Gated
# DeltaNet, 1 and 3 gated full attention rotating a quarter of each head by interleaved
# M-RoPE, zero-centred norms) on the Qwen3-VL demo's digits, with a tokenizer of their text
# that has Qwen's vision tags around each item (docs/qwen3_5.md: why the earlier recipes did
# not reach 0.90 in 15 minutes).
DEMO_QWEN35_FLAGS = --recipe demo_qwen35

demo-qwen35: setup
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc-per-node $(NPROC) \
		examples/pretrain_mllm.py $(DEMO_QWEN35_FLAGS)

# The demo's flags, for the GPU checks of docs/gpu.md: DEMO="$(make -s print-demo-flags)"
# (--recipe demo: the flags given after it win; `python tools/recipes.py demo` prints
# the recipe as the flags it sets).
print-demo-flags:
	@echo $(DEMO_FLAGS)

# The whole suite, and its 15 slowest tests. Tests marked `processes` (ranks, subprocesses)
# or `slow` (seconds in one process) are left out of test-fast (docs/testing.md).
# TEST_WORKERS test files run at once (pytest-xdist, a file's tests in one worker): a rank
# waiting on its peer or a one-process test leaves a core idle that the other file uses.
TEST_WORKERS ?= 2
PYTEST = HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test: setup
	$(PYTEST) --durations=15 tests

test-fast: setup
	$(PYTEST) -m "not processes and not slow" tests

# The suite on the newest releases (a fresh .venv-latest each time), not on the lock; first
# the packages whose newest release is not the locked one.
test-latest:
	rm -rf .venv-latest
	$(MAKE) --no-print-directory .venv-latest/.installed VENV=.venv-latest LOCK=
	@$(call freeze,.venv-latest) > .venv-latest/freeze.txt
	@echo "newest releases against the lock (< locked, > newest):"
	@grep -v '^#' requirements-lock.txt | diff - .venv-latest/freeze.txt | grep '^[<>]' \
	  || echo "  none: the newest releases are the locked ones"
	$(MAKE) --no-print-directory test VENV=.venv-latest LOCK=

# ruff with pyproject.toml's rules (tests/test_lint.py runs the same inside `make test`).
lint: setup
	$(VENV)/bin/python -m ruff check .

# A single-GPU node without internet access, with Python 3.12 and a CUDA build of torch
# (docs/gpu.md). On a connected machine, `make gpu-wheels` downloads the wheels such a node
# lacks into $(WHEELS) (binary wheels for CPython $(GPU_PYTHON_VERSION), no dependencies:
# the node's torch, numpy, transformers, ... stay); copy the folder and the checkout there
# and run `make gpu-check WHEELS=gpu-wheels`: it installs them offline, runs the checks
# (8 minutes on one H100) and writes runs/gpu-check/report.{json,md}.
# `make gpu-check DRY_RUN=1` prints the checks and their time budget, anywhere.
WHEELS             ?= gpu-wheels
GPU_PYTHON         ?= python3
GPU_PYTHON_VERSION ?= 3.12
# the pure-Python packages the node lacks, at their locked versions
GPU_WHEELS         ?= $(shell grep -iE '^(megatron-core|mistral[-_]common)==' requirements-lock.txt)
GPU_PLATFORMS      := $(foreach p,manylinux_2_28_x86_64 manylinux_2_27_x86_64 \
	manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any,--platform $(p))

gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --implementation cp \
		--python-version $(GPU_PYTHON_VERSION) $(GPU_PLATFORMS) -d $(WHEELS) $(GPU_WHEELS)
	@du -sh $(WHEELS)

gpu-check:
	$(GPU_PYTHON) tools/gpu_check.py $(if $(DRY_RUN),--dry-run,$(if $(wildcard \
		$(WHEELS)/*.whl),--wheels $(WHEELS))) --demo-flags "$(DEMO_FLAGS)"

clean:
	rm -rf $(VENV) .venv-lock .venv-latest runs
