"""Train a multimodal LLM (vision and/or audio encoders + projectors + LLM) with Megatron-Core.

    torchrun --nproc-per-node 2 examples/pretrain_mllm.py --tensor-model-parallel-size 2 \\
        --micro-batch-size 16 --global-batch-size 32 --train-iters 300 --lr 1e-3 ...

The same command runs on GPUs (NCCL) and on CPUs (gloo); without --data-path it trains on
the built-in handwritten-digits question answering data (with --audio-model-type whisper:
handwritten + spoken digits, "Add the written and the spoken digit."). See --help, and
examples/slurm/ for several nodes.
"""

import sys

from megatron_mm.startup import prepare_megatron_core

prepare_megatron_core()  # TE checked, CPU patches applied: before any megatron.core import

from megatron_mm.training.assembly.initialize import shutdown_distributed  # noqa: E402
from megatron_mm.training.errors import USER_ERRORS, peer_stopped  # noqa: E402
from megatron_mm.training.pretrain import pretrain  # noqa: E402
from megatron_mm.training.cli.arguments import parse_run_config  # noqa: E402
from megatron_mm.training.cli.user_errors import exit_with_user_error  # noqa: E402

if __name__ == "__main__":  # required: checkpoint saving spawns helper processes
    config = parse_run_config()
    try:
        pretrain(config)
    except USER_ERRORS as e:  # bad input: say what to fix, once per job, no traceback
        shutdown_distributed(barrier=False)
        exit_with_user_error(e)
    except RuntimeError as e:  # another rank stopped (and said why): stop without a word
        if not peer_stopped(e):
            raise
        shutdown_distributed(barrier=False)
        sys.exit(1)
    shutdown_distributed()
