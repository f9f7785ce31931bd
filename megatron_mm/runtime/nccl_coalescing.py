"""NCCL's coalesced ``batch_isend_irecv``, emulated on gloo
(``MEGATRON_MM_EMULATE_NCCL_COALESCING=1``).

On a backend that coalesces (NCCL), torch's ``batch_isend_irecv`` issues the batch inside
``_coalescing_manager(..., async_ops=True)`` and returns ``cm.works``: ONE ``Work`` for the
whole batch, the one ``group._end_coalescing`` gives (torch ``distributed_c10d.py``,
``batch_isend_irecv``, the ``supports_coalescing`` branch). A received tensor holds its
data only once that ``Work`` is waited for. Gloo does not coalesce: one ``Work`` per op,
and each receive fills the caller's tensor as it completes, so code that waits for the
wrong ``Work`` (or none) still reads the right numbers there, by luck.

With the variable set, a batch on a backend that does not coalesce gets NCCL's contract:
one ``Work``; each receive lands in a private buffer while the caller's tensor holds
garbage (NaN, or the dtype's largest value), and only that ``Work``'s ``wait`` copies the
data in. A read before the wait gives wrong numbers instead of passing by luck. On a
backend that coalesces itself the batch is torch's, unchanged.
"""

from __future__ import annotations

import datetime
import os
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist


def emulate_nccl_coalescing() -> bool:
    """Whether batches get NCCL's one-``Work`` contract on gloo."""
    return os.environ.get("MEGATRON_MM_EMULATE_NCCL_COALESCING", "0") == "1"


def _coalesces(group: dist.ProcessGroup, device: torch.device) -> bool:
    # torch's own test for the coalescing branch of batch_isend_irecv
    return type(group) is dist.ProcessGroup and group._get_backend(device).supports_coalescing


def poison(tensor: torch.Tensor) -> None:
    """Garbage in ``tensor``: what a reader sees before the data has arrived."""
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.fill_(float("nan"))
    else:
        tensor.fill_(True if tensor.dtype == torch.bool else torch.iinfo(tensor.dtype).max)


class CoalescedWork(dist.Work):
    """The one ``Work`` of an emulated batch: waits for every op's ``Work``, then copies
    each received buffer into the caller's tensor."""

    def __init__(self, works: Sequence[dist.Work],
                 landed: Sequence[Tuple[torch.Tensor, torch.Tensor]]):
        super().__init__()
        self.works, self.landed = list(works), list(landed)  # (private buffer, caller's)
        self.done = False

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        if not self.done:
            for work in self.works:
                work.wait() if timeout is None else work.wait(timeout)
            for private, tensor in self.landed:
                tensor.copy_(private)
            self.works, self.landed, self.done = [], [], True
        return True

    def is_completed(self) -> bool:
        return self.done


def batch_isend_irecv(ops: Sequence[dist.P2POp]) -> List[dist.Work]:
    """``torch.distributed.batch_isend_irecv``, with NCCL's one ``Work`` per batch on gloo
    when ``MEGATRON_MM_EMULATE_NCCL_COALESCING=1``."""
    ops = list(ops)
    if not emulate_nccl_coalescing() or _coalesces(ops[0].group, ops[0].tensor.device):
        return dist.batch_isend_irecv(ops)
    issued, landed = [], []
    for op in ops:
        if op.op is dist.irecv:
            private = torch.empty_like(op.tensor)
            landed.append((private, op.tensor))
            op = dist.P2POp(dist.irecv, private, op.peer, op.group, op.tag)
        issued.append(op)
    works = dist.batch_isend_irecv(issued)
    for _, tensor in landed:
        poison(tensor)
    return [CoalescedWork(works, landed)]
