"""Make ``torch.cuda.current_device()`` return the CPU device without CUDA.

About 130 call sites in megatron-core 0.19.2 use it as a ``device=`` argument; the ones on
our path: ``rotary_pos_embedding.py`` (RoPE), ``p2p_communication.py`` (receive buffers),
``dist_checkpointing/strategies/state_dict_saver.py``, ``tensor_parallel/layers.py`` and
the DDP buffers.
"""

import torch


def _current_device():
    return torch.device("cpu")


def apply() -> None:
    torch.cuda.current_device = _current_device
