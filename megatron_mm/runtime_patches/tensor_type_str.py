"""Let ``tensor.type()`` compare equal to the CUDA type names Megatron asserts on.

Replaces ``torch.Tensor.type`` for the no-argument form only (megatron-core 0.19.2 call
sites: ``clip_grads.py`` ``assert param.grad.type() == 'torch.cuda.FloatTensor'``,
``distrib_optimizer.py`` "Wrapped parameters must be one of torch.cuda.FloatTensor, ...",
``optimizer.py`` bf16 ``Float16OptimizerWithFloat16Params``). The result is a ``str``
equal to both ``torch.FloatTensor`` and ``torch.cuda.FloatTensor``.
"""

import torch


class _TypeName(str):
    def _cpu(self, other):
        return other.replace("torch.cuda.", "torch.") if isinstance(other, str) else other

    def __eq__(self, other):
        return str.__eq__(self, self._cpu(other))

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__


def _wrap(type_fn):
    def type_(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and not kwargs:
            return _TypeName(type_fn(self))
        return type_fn(self, dtype, non_blocking, **kwargs)

    type_.__wrapped__ = type_fn
    return type_


def apply() -> None:
    if not hasattr(torch.Tensor.type, "__wrapped__"):
        torch.Tensor.type = _wrap(torch.Tensor.type)
