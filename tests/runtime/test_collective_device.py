"""Collectives take their tensors on the device of the group's backend
(``runtime/collective_device.py``): NCCL -> the current CUDA device, gloo -> CPU."""

import torch

from megatron_mm.runtime.collective_device import collective_device, device_for_backend


def test_nccl_means_the_current_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert device_for_backend("nccl") == torch.device("cuda", 3)
    assert device_for_backend("cpu:gloo,cuda:nccl") == torch.device("cuda", 3)
    assert device_for_backend("gloo") == torch.device("cpu")


def test_gloo_world_reduces_on_cpu_and_partition_trials_run_there(gloo_world):
    from argparse import Namespace

    from megatron_mm.training.planning.partition_trials import time_candidate

    assert collective_device() == torch.device("cpu")
    assert collective_device(gloo_world.get_data_parallel_group()) == torch.device("cpu")
    steps = []
    seconds = time_candidate(Namespace(pipeline_search_iters=3), build=lambda: "model",
                             batches=lambda: "data",
                             step=lambda run, data: steps.append((run, data)))
    assert steps == [("model", "data")] * 4 and seconds >= 0.0
