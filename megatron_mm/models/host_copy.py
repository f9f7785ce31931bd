"""Host tensors to the device without a host sync.

A copy from host memory that does not say ``non_blocking`` synchronises the CUDA stream
(torch's ``copy_`` ends in ``memcpy_and_sync``), and a ``non_blocking`` one from pageable
memory may still wait: the driver stages pageable memory through pinned buffers ("the
driver may synchronize with the stream", CUDA's API sync behaviour). So what the host
computes per micro-batch (codes, layouts, batches of a loader that does not pin) goes
through pinned memory; torch's caching host allocator keeps the pinned block until the
copy has run. On a CPU run nothing moves.
"""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` on ``device``: a ``non_blocking`` copy, from pinned memory when ``t`` is on
    the host and ``device`` is a GPU."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)
