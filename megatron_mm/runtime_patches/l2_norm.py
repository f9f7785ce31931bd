"""A CPU drop-in for ``megatron.core.utils.local_multi_tensor_l2_norm``.

Replaces it and ``megatron.core.optimizer.clip_grads.l2_norm_impl`` (bound by name at
import; megatron-core 0.19.2). Upstream ends with ``torch.tensor(..., device="cuda")``; it
also rounds the norm through a Python float, which this version avoids.
"""

import torch


def local_multi_tensor_l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    norms = [torch.linalg.vector_norm(t.float()) for tensors in tensor_lists for t in tensors]
    if not norms:
        return torch.zeros(1), None
    return torch.linalg.vector_norm(torch.stack(norms)).reshape(1), None


def apply() -> None:
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads

    if clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = local_multi_tensor_l2_norm
    utils.local_multi_tensor_l2_norm = local_multi_tensor_l2_norm
