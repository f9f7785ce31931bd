"""Point-to-point messages between pipeline ranks, addressed by what they carry.

A schedule decides when each rank produces and consumes a tensor, and a consumer may need
a peer's messages in another order than the peer sent them (an encoder piece's output
before an LLM activation, say). So every message travels as a small header (its key,
shape and dtype) followed by its payload, sends never block, and a receiver reads a peer's
messages in the order they were sent, keeping the ones it does not need yet. Reading in
send order is what NCCL requires (it matches by order, not by tag) and never waits longer
than the schedule itself: a message sent before the one needed arrives before it.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

Key = Tuple[str, int, int]  # (what, micro-batch, chunk or encoder piece)

_KINDS = ("F", "B", "EF", "EB")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_MAX_DIMS = 7
_HEADER = 3 + 2 + _MAX_DIMS  # kind, micro-batch, chunk, then ``describe``


def describe(tensor: Optional[torch.Tensor]) -> List[int]:
    """What a receiver needs to allocate ``tensor``: dtype, ndim (-1: None), its dims
    (``_MAX_DIMS`` slots); the header of a message, also of the encoder replicas'
    broadcast."""
    if tensor is None:
        return [0, -1] + [0] * _MAX_DIMS
    if tensor.dim() > _MAX_DIMS:
        raise ValueError(f"cannot send a {tensor.dim()}-d tensor between ranks")
    return ([_DTYPES.index(tensor.dtype), tensor.dim()] + list(tensor.shape)
            + [0] * (_MAX_DIMS - tensor.dim()))


def allocate(description: List[int], device: torch.device) -> Optional[torch.Tensor]:
    """An empty tensor as ``describe`` gave it (None for None)."""
    dtype, ndim = description[0], description[1]
    if ndim < 0:
        return None
    return torch.empty(description[2:2 + ndim], dtype=_DTYPES[dtype], device=device)


class Mailbox:
    def __init__(self, group, device: torch.device):
        self.group, self.device = group, device
        self.ranks = dist.get_process_group_ranks(group)  # group rank -> global rank
        self.pending: List[dist.Work] = []
        self.alive: List[torch.Tensor] = []  # isend buffers, until their send completes
        self.kept: Dict[Tuple[int, Key], Optional[torch.Tensor]] = {}

    def send(self, peer: int, key: Key, tensor: Optional[torch.Tensor]) -> None:
        """Send ``tensor`` (or None: nothing to carry, e.g. no media) to pipeline rank
        ``peer``; the buffers stay referenced until ``wait``."""
        header = torch.tensor([_KINDS.index(key[0]), key[1], key[2]] + describe(tensor),
                              dtype=torch.int64, device=self.device)
        dst = self.ranks[peer]
        self.pending.append(dist.isend(header, dst=dst, group=self.group))
        if tensor is not None and tensor.numel():
            payload = tensor.detach().contiguous()
            self.pending.append(dist.isend(payload, dst=dst, group=self.group))
            self.alive.append(payload)
        self.alive.append(header)

    def recv(self, peer: int, key: Key) -> Optional[torch.Tensor]:
        """The message ``key`` from pipeline rank ``peer`` (blocking)."""
        while (peer, key) not in self.kept:
            header = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
            dist.recv(header, src=self.ranks[peer], group=self.group)
            h = header.tolist()
            got = (_KINDS[h[0]], h[1], h[2])
            tensor = allocate(h[3:], self.device)
            if tensor is not None and tensor.numel():
                dist.recv(tensor, src=self.ranks[peer], group=self.group)
            self.kept[(peer, got)] = tensor
        return self.kept.pop((peer, key))

    def wait(self) -> None:
        """Finish every send (end of the iteration); nothing may be left unread."""
        for work in self.pending:
            work.wait()
        self.pending.clear()
        self.alive.clear()
        if self.kept:
            raise RuntimeError(f"messages received but never used: {sorted(self.kept)[:4]}")
