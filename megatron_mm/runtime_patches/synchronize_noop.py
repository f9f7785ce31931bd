"""Make ``torch.cuda.synchronize`` a no-op without CUDA.

Hit in megatron-core 0.19.2 by ``p2p_communication._communicate`` (batched p2p with
``batch_p2p_sync``), ``_communicate_shapes`` and ``dist_checkpointing``'s
``filesystem_async.preload_tensors``. CPU work is already synchronous.
"""

import torch


def _synchronize(device=None):
    return None


def apply() -> None:
    torch.cuda.synchronize = _synchronize
