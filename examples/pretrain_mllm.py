"""Train a multimodal LLM (vision and/or audio encoders + projectors + LLM) with Megatron-Core.

    torchrun --nproc-per-node 2 examples/pretrain_mllm.py --tensor-model-parallel-size 2 \\
        --micro-batch-size 16 --global-batch-size 32 --train-iters 300 --lr 1e-3 ...

The same command runs on GPUs (NCCL) and on CPUs (gloo); without --data-path it trains on
the built-in handwritten-digits question answering data (with --audio-model-type whisper:
handwritten + spoken digits, "Add the written and the spoken digit."). See --help, and
examples/slurm/ for several nodes. ``megatron_mm.training.main`` parses, trains, reports a
user's error once per job and shuts the process groups down.
"""

from megatron_mm.startup import prepare_megatron_core

prepare_megatron_core()  # TE checked, CPU patches applied: before any megatron.core import

from megatron_mm.training.main import main  # noqa: E402

if __name__ == "__main__":  # required: checkpoint saving spawns helper processes
    main()
