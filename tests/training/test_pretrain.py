"""The DDP settings the run hands Megatron-Core."""

import dataclasses

from megatron_mm.training.assembly.model_setup import ddp_config
from megatron_mm.training.cli.arguments import parse_run_config


def test_fp8_param_gather_reaches_the_ddp_config():
    # Megatron-Core's distributed optimizer all-gathers FP8 parameters and requantises
    # them after each step only with DistributedDataParallelConfig.fp8_param_gather (on
    # the CPU TE is absent, so the flag is set as TE's validation leaves it).
    run = parse_run_config(["--use-distributed-optimizer"], world_size=1)
    assert ddp_config(run).fp8_param_gather is False
    run = dataclasses.replace(run, fp8=dataclasses.replace(run.fp8, fp8_param_gather=True))
    config = ddp_config(run)
    assert config.fp8_param_gather and config.use_distributed_optimizer
    assert config.grad_reduce_in_fp32
