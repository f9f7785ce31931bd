"""Patch ``training_cuda``: the CUDA calls of Megatron-LM's training modules run on the CPU,
scoped to those modules (torch itself keeps answering "no CUDA"). The whole loop under
it: tests/megatron_lm/test_megatron_lm_pretrain.py (Megatron-LM's pretrain on gloo ranks)."""

import pytest
import torch

pytestmark = pytest.mark.slow  # imports Megatron-LM's training package

CUDA_MISSING = "Torch not compiled with CUDA enabled"


def test_megatron_lm_sees_one_device_torch_none():
    from megatron.training import initialize

    assert initialize.torch.cuda.is_available() and initialize.torch.cuda.device_count() == 1
    assert initialize.torch.cuda.set_device(0) is None
    assert not torch.cuda.is_available() and torch.cuda.device_count() == 0
    x = initialize.torch.rand(2, device="cuda")  # _warmup_jit_function's allocations
    assert x.device.type == "cpu"


def test_training_streams_factories_and_rng():
    from megatron.training import checkpointing, training
    from megatron.training.utils import common_utils

    stream = training.torch.cuda.Stream()
    stream.wait_stream(training.torch.cuda.current_stream())
    with training.torch.cuda.stream(stream):  # get_model's DDP wrap
        flags = training.torch.tensor([1, 0, 0], dtype=torch.long, device="cuda")
    assert flags.device.type == "cpu"
    assert training.set_jit_fusion_options() is None  # no GPU fusions to warm up
    assert checkpointing.torch.cuda.get_rng_state().numel() == 0
    assert checkpointing.torch.cuda.set_rng_state(torch.empty(0)) is None
    assert common_utils.torch.cuda.memory_allocated() == 0
    assert common_utils.get_device_arch_version() >= 10  # no CUDA_DEVICE_MAX_CONNECTIONS
    with pytest.raises(AssertionError, match=CUDA_MISSING):  # outside those modules
        torch.cuda.get_rng_state()


def test_rerun_state_machine_saves_and_restores_its_state():
    from megatron.core import rerun_state_machine as rsm

    machine = rsm.RerunStateMachine(mode=rsm.RerunMode.VALIDATE_RESULTS)
    machine._save_state()  # upstream: torch.cuda.get_rng_state() -> CUDA_MISSING
    machine._restore_state()


def test_megatron_lm_defaults_to_what_a_cpu_runs():
    """Without CUDA, Megatron-LM's parser defaults to gloo and no GPU-only fusions (before:
    nccl, "Distributed package doesn't have NCCL built in"); a flag given still wins."""
    import argparse

    from megatron.training.arguments import add_megatron_arguments

    from megatron_mm.runtime_patches.training_cuda import CPU_DEFAULTS

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    args = parser.parse_args([])
    assert {name: getattr(args, name) for name in CPU_DEFAULTS} == {
        "distributed_backend": "gloo", "apply_rope_fusion": False,
        "no_persist_layer_norm": True, "gradient_accumulation_fusion": False}
    given = parser.parse_args(["--distributed-backend", "nccl"])
    assert given.distributed_backend == "nccl"
