"""Megatron-LM's training loop (``megatron.training``, megatron-core 0.19.2's wheel) on a
machine without CUDA: the CUDA calls of ``megatron.training.initialize``,
``megatron.training.training``, ``megatron.training.checkpointing``,
``megatron.training.utils.common_utils`` and ``megatron.core.rerun_state_machine``, each
module's own name ``torch``
replaced by a proxy (as ``cuda_literals`` does for Megatron-Core's), applied when the
module is imported (``after_import``).

What each replaces, and why it cannot matter on a CPU:

* ``initialize.py``: ``initialize_megatron``'s ``assert torch.cuda.is_available()``, and
  ``_initialize_distributed`` / ``_set_random_seed``, which build Megatron-Core's process
  groups and seed the RNG tracker only when ``torch.cuda.device_count() > 0``: here the
  process's one device is the CPU (``device_count()`` 1, ``set_device`` nothing to do).
  ``_warmup_jit_function`` allocates ``device="cuda"``: CPU tensors.
* ``training.py``: ``device='cuda'`` tensor factories (the start-time all-reduce, the loss
  dicts, the exit-duration and data-flag broadcasts): CPU tensors; ``get_model``'s
  ``torch.cuda.Stream()`` / ``torch.cuda.stream(...)`` around the DDP wrap: a do-nothing
  stream and context (CPU work has one order); ``empty_cache``: nothing to free;
  ``megatron.training.training.set_jit_fusion_options``: its warm-up only pre-compiles
  the GPU fusions, so it is
  skipped (the fusions compile on their first use, as without the warm-up).
* ``checkpointing.py``: ``torch.cuda.get_rng_state`` / ``set_rng_state`` in the saved RNG
  state: there is no CUDA generator (the CPU's, saved beside it, is the one in use);
  ``device='cuda'`` factories.
* ``megatron.core.rerun_state_machine`` (which only Megatron-LM's ``train_step`` runs):
  ``_save_state`` / ``_restore_state``'s CUDA RNG state, as in ``checkpointing.py``.
* ``utils/common_utils.py``: ``device='cuda'`` factories (grad norms, the loss report);
  ``report_memory``'s ``torch.cuda.memory_*``: 0 bytes;
  ``megatron.training.utils.common_utils.get_device_arch_version`` (also
  bound in ``arguments.py``, where ``validate_args`` asks it at TP or CP > 1 whether the
  GPU needs ``CUDA_DEVICE_MAX_CONNECTIONS=1``): a CPU has no kernel queues to order, so it
  answers as a device without that need (10, Blackwell's).
* ``arguments.py``: ``arguments.add_megatron_arguments``' defaults that only a GPU can run
  (``CPU_DEFAULTS``: ``--distributed-backend nccl``, which a CPU torch does not build; the
  rope, persistent layer-norm and gradient-accumulation fusions, CUDA kernels) default to
  what a CPU runs,
  as if ``--distributed-backend gloo --no-rope-fusion --no-persist-layer-norm
  --no-gradient-accumulation-fusion`` were given; a flag on the command line still wins.
"""

from __future__ import annotations

import contextlib
import types

import torch

from .after_import import after_import
from .cuda_literals import _CpuTorch
from .current_stream import _STREAM


class _Namespace(types.ModuleType):
    """``torch.cuda`` with some names replaced."""

    def __init__(self, **replaced):
        super().__init__("torch.cuda")
        self.__dict__.update(replaced)

    def __getattr__(self, name):
        return getattr(torch.cuda, name)


def _nothing(*args, **kwargs):
    return None


def _zero(*args, **kwargs):
    return 0


def _torch_with(cuda: _Namespace) -> _CpuTorch:
    proxy = _CpuTorch()
    proxy.cuda = cuda
    return proxy


def _no_cuda_rng_state(*args, **kwargs):
    return torch.empty(0, dtype=torch.uint8)


CUDA = {
    "megatron.training.initialize": dict(
        is_available=lambda: True, device_count=lambda: 1, set_device=_nothing,
        empty_cache=_nothing),
    "megatron.training.training": dict(
        Stream=lambda *a, **k: _STREAM, stream=lambda *a, **k: contextlib.nullcontext(),
        empty_cache=_nothing, memory_stats=lambda *a, **k: {}),
    "megatron.training.checkpointing": dict(
        get_rng_state=_no_cuda_rng_state, set_rng_state=_nothing, empty_cache=_nothing),
    # Megatron-Core's, used by Megatron-LM's train_step alone (its factories: cuda_literals)
    "megatron.core.rerun_state_machine": dict(
        get_rng_state=_no_cuda_rng_state, set_rng_state=_nothing),
    "megatron.training.utils.common_utils": dict(
        memory_allocated=_zero, max_memory_allocated=_zero, memory_reserved=_zero,
        max_memory_reserved=_zero),
}


def _no_queue_ordering_arch() -> int:
    return 10


# Megatron-LM's flag defaults a CPU cannot run -> what it runs (the parser's attribute names)
CPU_DEFAULTS = {"distributed_backend": "gloo", "apply_rope_fusion": False,
                "no_persist_layer_norm": True, "gradient_accumulation_fusion": False}


def _cpu_defaults(add_megatron_arguments):
    def add(parser):
        from megatron.core.tensor_parallel import layers

        parser = add_megatron_arguments(parser)
        # gradient accumulation fusion is Apex's kernel, not CUDA itself: off only where
        # Megatron-Core's linears cannot import it (they refuse the flag there)
        parser.set_defaults(**{**CPU_DEFAULTS, "gradient_accumulation_fusion":
                               layers._grad_accum_fusion_available})
        return parser
    add.__wrapped__ = add_megatron_arguments
    return add


def _patch(module) -> None:
    if module.__name__ in CUDA:
        module.torch = _torch_with(_Namespace(**CUDA[module.__name__]))
    if module.__name__ == "megatron.training.training":
        module.set_jit_fusion_options = _nothing
    if module.__name__ == "megatron.training.arguments":
        module.add_megatron_arguments = _cpu_defaults(module.add_megatron_arguments)
    if hasattr(module, "get_device_arch_version"):
        module.get_device_arch_version = _no_queue_ordering_arch


def apply() -> None:
    for name in (*CUDA, "megatron.training.arguments", "megatron.training.utils"):
        after_import(name, _patch)
