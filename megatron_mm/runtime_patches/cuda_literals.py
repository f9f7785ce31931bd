"""Turn ``device="cuda"`` tensor factories into CPU ones inside a few megatron-core modules.

Replaces the module-global name ``torch`` (megatron-core 0.19.2) in the modules below with a
proxy that forwards everything to torch except the tensor factories, where it maps
``device="cuda"`` to the CPU and drops ``pin_memory=True``. Examples of what it fixes:
``schedules.py`` ``total_num_tokens = torch.zeros([], device="cuda")`` in all three
schedules, ``FP32Optimizer._scale``, ``clip_grads``, ``grad_scaler``, and
``rope_utils`` (``pin_memory=True``). Scoped to these modules so nothing else changes.
"""

import importlib
import types

import torch

MODULES = (
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.grad_scaler",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.optimizer.layer_wise_optimizer",
    "megatron.core.rerun_state_machine",
    "megatron.core.models.mimo.optimizer",
    "megatron.core.models.common.embeddings.rope_utils",
)
FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "randn", "rand",
             "zeros_like", "ones_like", "empty_like", "full_like", "as_tensor")


def _is_cuda(device) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return True
    return torch.device(device).type == "cuda"


def _cpu_factory(fn):
    def factory(*args, **kwargs):
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        kwargs.pop("pin_memory", None)
        return fn(*args, **kwargs)

    factory.__name__ = fn.__name__
    return factory


class _CpuTorch(types.ModuleType):
    def __init__(self):
        super().__init__("torch")
        for name in FACTORIES:
            setattr(self, name, _cpu_factory(getattr(torch, name)))

    def __getattr__(self, name):  # everything else is plain torch
        return getattr(torch, name)


def apply() -> None:
    proxy = _CpuTorch()
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        module.torch = proxy
