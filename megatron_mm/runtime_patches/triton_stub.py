"""Stub ``megatron.core.transformer.moe.ops.paged_stash`` when triton is missing.

megatron-core 0.19.2 imports it unconditionally on ``import megatron.core``
(distributed -> finalize_model_grads -> schedules -> moe.paged_stash), and the module does
``import triton``. Only the MoE paged-stash feature uses it. A fake ``triton`` would flip
``HAVE_TRITON`` checks elsewhere, so only this one module is replaced.
"""

import sys
import types

from .registry import module_available

TARGET = "megatron.core.transformer.moe.ops.paged_stash"


def _unavailable(*args, **kwargs):
    raise RuntimeError("MoE paged stash needs triton: pip install triton")


def apply() -> None:
    if module_available("triton") or TARGET in sys.modules:
        return
    stub = types.ModuleType(TARGET)
    stub.GLOBAL_BLOCK_SIZE = 1024  # the upstream constant
    stub.paged_stash_copy_kernel = _unavailable
    stub.paged_stash_pop_kernel = _unavailable
    stub.__megatron_mm_stub__ = True
    sys.modules[TARGET] = stub
