"""The device a process group's collectives take their tensors on.

NCCL reduces only CUDA tensors and gloo is meant for CPU ones: a collective's tensor goes on
the device of the group's backend, not on whatever device the caller happened to use.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist


def device_for_backend(backend: str) -> torch.device:
    """``"nccl"`` (also as part of a per-device list such as ``"cpu:gloo,cuda:nccl"``):
    this process's current CUDA device; any other backend: the CPU."""
    if "nccl" in str(backend).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def collective_device(group: Optional[dist.ProcessGroup] = None) -> torch.device:
    """The device for tensors of collectives on ``group`` (None: the default group)."""
    return device_for_backend(dist.get_backend(group))
