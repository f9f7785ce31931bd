"""Per-stage memory: model state plus the activations of in-flight micro-batches.

A chunk of layers [i, j) that keeps n micro-batches in flight needs
    sum of param bytes (16 B/param trainable, 2 B/param frozen; ``MemoryModel``)
    (a tied output weight once where its rank also holds the word embedding)
  + n x sum of the activation bytes each layer keeps for its backward
    (none where no backward runs: a frozen encoder keeps nothing).
A rank holds all its chunks. The model ignores the CUDA context, allocator fragmentation,
temporary buffers and the p2p receive buffers; leave headroom in the limit.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from ..costs.hardware import MemoryModel
from .inflight import inflight_microbatches
from .layers import Layer
from .minmax import prefix_sums


class ChunkMemory:
    """O(1) memory of any layer range as any chunk, from prefix sums over the chain."""

    def __init__(self, chain: Sequence[Layer], pp: int, vpp: int,
                 num_microbatches: Optional[int], memory: MemoryModel):
        self.pp, self.vpp = pp, vpp
        self.params = prefix_sums([memory.layer_param_bytes(l.params, l.expert_params,
                                                            l.trainable) for l in chain])
        # A chunk holding both ends holds a tied output weight once (the embedding's).
        self.tied = memory.param_bytes(chain[-1].tied_params, chain[-1].trainable)
        self.length = len(chain)
        self.acts = prefix_sums([l.stored_act_bytes for l in chain])
        self.inflight = [inflight_microbatches(pp, vpp, r, num_microbatches) for r in range(pp)]

    def inflight_of_chunk(self, chunk: int) -> int:
        return self.inflight[chunk % self.pp][chunk // self.pp]

    def param_bytes(self, start: int, end: int) -> float:
        both_ends = start == 0 and end == self.length
        return self.params[end] - self.params[start] - (self.tied if both_ends else 0.0)

    def activation_bytes(self, start: int, end: int, chunk: int) -> float:
        return self.inflight_of_chunk(chunk) * (self.acts[end] - self.acts[start])

    def __call__(self, start: int, end: int, chunk: int) -> float:
        return self.param_bytes(start, end) + self.activation_bytes(start, end, chunk)


def stage_memory(chain: Sequence[Layer], bounds: Sequence[Sequence[int]], pp: int, vpp: int,
                 num_microbatches: Optional[int], memory: MemoryModel):
    """(param bytes, activation bytes) per rank, for chunks given as [start, end) bounds."""
    mem = ChunkMemory(chain, pp, vpp, num_microbatches, memory)
    params: List[float] = [0.0] * pp
    acts: List[float] = [0.0] * pp
    for chunk, (start, end) in enumerate(bounds):
        params[chunk % pp] += mem.param_bytes(start, end)
        acts[chunk % pp] += mem.activation_bytes(start, end, chunk)
    return params, acts, mem.inflight
