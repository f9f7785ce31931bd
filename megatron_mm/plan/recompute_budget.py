"""Adaptive recomputation (OmniBal): per chunk, how many transformer layers recompute.

Megatron-Core's ``recompute_method='block'`` recomputes the first N transformer layers of
each stack (``TransformerBlock``) in a chunk; every chunk builds its own config, so N may
differ per chunk. A rank needs
    static bytes (params, grads, optimizer state)
  + sum over its chunks of inflight(chunk) x activation bytes of one micro-batch,
where a recomputed layer keeps only its input (``recompute_act_bytes``; plus, once, the
full activations of the layer being recomputed) and any other layer keeps what it saves
for backward (``act_bytes``; measured with saved-tensor hooks,
``training/activation_profile.py``). Per rank, the smallest N (the same for its chunks)
that fits the budget is chosen: recomputing fewer layers is less time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence

from .errors import PlanError
from .hardware import MemoryModel
from .layers import TRANSFORMER_KINDS, Layer
from .memory import ChunkMemory
from .record import Record
from .schedule import inflight_microbatches

GB = 1024 ** 3


@dataclass
class LayerActivation(Record):
    stack: str  # "llm" or an encoder's name; the block N counts within a stack
    act_bytes: float  # saved for backward, no recompute
    recompute_act_bytes: float  # saved for backward when recomputed (its input)


@dataclass
class ChunkActivations(Record):
    rank: int
    inflight: int  # micro-batches this chunk holds at its peak
    layers: List[LayerActivation] = field(default_factory=list)  # transformer layers
    other_bytes: float = 0.0  # embeddings, projectors, head: never recomputed

    def bytes_with(self, n: int) -> float:
        """Activation bytes of the chunk with the first ``n`` layers of each stack
        recomputed, over its in-flight micro-batches, plus the one recomputed layer whose
        full activations live again during its backward."""
        seen: dict = {}
        total, transient = self.other_bytes, 0.0
        for layer in self.layers:
            k = seen[layer.stack] = seen.get(layer.stack, 0) + 1
            total += layer.recompute_act_bytes if k <= n else layer.act_bytes
            if k <= n:
                transient = max(transient, layer.act_bytes)
        return self.inflight * total + transient

    @property
    def max_stack_layers(self) -> int:
        counts: dict = {}
        for layer in self.layers:
            counts[layer.stack] = counts.get(layer.stack, 0) + 1
        return max(counts.values(), default=0)


@dataclass
class RecomputeChoice(Record):
    recompute_num_layers: List[int]  # per chunk (chunk order)
    rank_bytes: List[float]  # static + activation bytes per pipeline rank with that choice
    budget_bytes: float


def choose_recompute(chunks: Sequence[ChunkActivations], static_bytes: Sequence[float],
                     budget_bytes: float) -> RecomputeChoice:
    """Per rank the smallest block N that fits ``budget_bytes``; error if none does."""
    n_per_chunk = [0] * len(chunks)
    rank_bytes = []
    for rank, static in enumerate(static_bytes):
        mine = [c for c, ch in enumerate(chunks) if ch.rank == rank]
        top = max((chunks[c].max_stack_layers for c in mine), default=0)
        for n in range(top + 1):
            need = static + sum(chunks[c].bytes_with(n) for c in mine)
            if need <= budget_bytes:
                break
        else:
            raise PlanError(
                f"--recompute-memory-budget {budget_bytes / GB:.3g} GB: pipeline rank {rank} "
                f"needs {need / GB:.3g} GB even with full recompute ({static / GB:.3g} GB "
                "model state); raise the budget or add pipeline stages")
        for c in mine:
            n_per_chunk[c] = n
        rank_bytes.append(need)
    return RecomputeChoice(n_per_chunk, rank_bytes, budget_bytes)


def chunk_activations(chain: Sequence[Layer], bounds: Sequence[Sequence[int]], pp: int,
                      vpp: int, num_microbatches: int) -> List[ChunkActivations]:
    """The chooser's input from a chain (activation bytes measured or modelled) and the
    partition's [start, end) chunk bounds."""
    out = []
    for c, (start, end) in enumerate(bounds):
        rank = c % pp
        ch = ChunkActivations(rank, inflight_microbatches(pp, vpp, rank,
                                                          num_microbatches)[c // pp])
        for layer in chain[start:end]:
            if not layer.runs_backward:
                continue  # runs under no_grad: keeps nothing
            if layer.kind in TRANSFORMER_KINDS:
                ch.layers.append(LayerActivation(layer.branch, layer.act_bytes,
                                                 layer.recompute_act_bytes))
            else:
                ch.other_bytes += layer.act_bytes
        out.append(ch)
    return out


def static_bytes(chain: Sequence[Layer], bounds: Sequence[Sequence[int]], pp: int,
                 memory: MemoryModel) -> List[float]:
    """Params, gradients and optimizer state per pipeline rank (``MemoryModel``)."""
    mem = ChunkMemory(chain, pp, 1, None, memory)
    out = [0.0] * pp
    for c, (start, end) in enumerate(bounds):
        out[c % pp] += mem.param_bytes(start, end)
    return out
