# Two commands do everything on a fresh machine:
#   make demo   set up .venv, then train the built-in demo and print its held-out accuracy
#   make test   set up .venv, then run the test suite
PYTHON ?= python3.11
VENV   ?= .venv
# On a GPU machine pass the CUDA build you want, e.g. TORCH="torch==2.13.0 --index-url ...".
TORCH  ?= torch==2.13.0
PIP    := $(VENV)/bin/python -m pip
NPROC  ?= 2

.PHONY: demo test setup clean

setup: $(VENV)/.installed

# torch first and pinned, so no later requirement pulls a different (CUDA) build.
# megatron-core 0.19.2 says Requires-Python >=3.12 but its cp311 wheel works: it alone is
# installed with --ignore-requires-python (for everything, pip would pick releases that
# need 3.12 and build them from source); its own requirements come with the package's.
# mistral-common only ships the demo's SentencePiece tokenizer file: --no-deps.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q --no-deps --ignore-requires-python megatron-core==0.19.2
	$(PIP) install -q --no-deps --no-warn-conflicts mistral-common==1.13.1
	$(PIP) install -q --no-warn-conflicts -e ".[test,hf]"
	touch $@

# The demo: CLIP-style ViT + MLP projector + Llama-style LLM on real handwritten digits,
# data-parallel over $(NPROC) processes (gloo on CPU, NCCL on GPUs).
DEMO_FLAGS = \
	--num-layers 2 --hidden-size 128 --num-attention-heads 4 --group-query-attention \
	--num-query-groups 2 --seq-length 64 \
	--vision-hidden-size 64 --vision-num-layers 2 --vision-num-attention-heads 4 \
	--img-h 16 --img-w 16 --patch-dim 8 --disable-vision-class-token \
	--micro-batch-size 16 --global-batch-size 32 --train-iters 600 \
	--lr 1e-3 --min-lr 1e-5 --lr-decay-style cosine --lr-warmup-iters 10 \
	--weight-decay 0.01 --clip-grad 1.0 --seed 1234 \
	--log-interval 50 --eval-interval 200 --eval-iters 10 \
	--save runs/demo/checkpoints --save-interval 600

demo: setup
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc-per-node $(NPROC) \
		examples/pretrain_mllm.py $(DEMO_FLAGS)

test: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q tests

clean:
	rm -rf $(VENV) runs
