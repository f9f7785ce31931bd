"""Make ``torch.Tensor.cuda`` the identity on a machine without CUDA.

Upstream call sites hit (megatron-core 0.19.2): ``language_module.py``
``weight.data.cuda()`` (shared embeddings with PP), ``clip_vit_model.py``
``position_ids.cuda()``, ``optimizer.py``, ``distrib_optimizer.py``. Without CUDA the call
can never succeed, so replacing it cannot break working code.
"""

import torch


def _cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
    return self


def apply() -> None:
    torch.Tensor.cuda = _cuda
