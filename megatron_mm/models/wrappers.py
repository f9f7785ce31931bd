"""Megatron-Core's model wrappers (``Float16Module``, ``DistributedDataParallel``) that pass
``set_is_first_microbatch`` on to the model they wrap.

Megatron-Core's schedules call it on the outermost wrapper (``forward_step``), and so does
our executor (``get_attr_wrapped_model`` stops at the first object that has it). The
wrappers inherit ``MegatronModule.set_is_first_microbatch``, which does nothing unless the
wrapper's config (the LLM's) is FP8: an FP8 encoder or projector under a BF16 LLM would
keep Transformer Engine's step-1 FP8 weights for good. ``MultimodalModel``'s own version
refreshes every module that caches FP8 weights.
"""

from __future__ import annotations

from megatron.core.distributed import DistributedDataParallel as _DistributedDataParallel
from megatron.core.transformer.module import Float16Module as _Float16Module


class _PassFirstMicrobatch:
    module: object

    def set_is_first_microbatch(self) -> None:
        self.module.set_is_first_microbatch()


class Float16Module(_PassFirstMicrobatch, _Float16Module):
    pass


class DistributedDataParallel(_PassFirstMicrobatch, _DistributedDataParallel):
    pass
