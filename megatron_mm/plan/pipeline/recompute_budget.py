"""Adaptive recomputation (OmniBal): per rank, how many layers of each stack recompute.

Megatron-Core's ``recompute_method='block'`` recomputes the first N transformer layers of
a stack (``TransformerBlock``); every stack of every chunk builds its own config, so N may
differ per stack (the ViT's, the audio encoder's, the LLM's) and per chunk. A rank needs
    static bytes (params, grads, optimizer state)
  + sum over its chunks of inflight(chunk) x activation bytes of one micro-batch,
where a recomputed layer keeps only its input (``recompute_act_bytes``; plus, once per
chunk, the full activations of the layer being recomputed) and any other layer keeps what
it saves for backward (``act_bytes``; measured with saved-tensor hooks,
``training/activation_profile.py``). Recomputing a layer costs one more forward
(``recompute_cost``). Per rank, OmniBal's small knapsack: over every N per stack (the same
for the rank's chunks), the choice that fits the budget at the least recompute cost; a
vision layer and an LLM layer free different bytes per unit of time, so the stacks
usually get different N.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Sequence, Union

from ..costs.hardware import MemoryModel
from ..errors import PlanError
from ..record import Record
from .inflight import inflight_microbatches
from .layers import TRANSFORMER_KINDS, Layer
from .memory import ChunkMemory

GB = 1024 ** 3


@dataclass
class LayerActivation(Record):
    stack: str  # "llm" or an encoder's name; the block N counts within a stack
    act_bytes: float  # saved for backward, no recompute
    recompute_act_bytes: float  # saved for backward when recomputed (its input)
    recompute_cost: float = 0.0  # one more forward (the chain's cost unit)


def _n_of(n: Union[int, Mapping[str, int]], stack: str) -> int:
    return n if isinstance(n, int) else n.get(stack, 0)


@dataclass
class ChunkActivations(Record):
    rank: int
    inflight: int  # micro-batches this chunk holds at its peak
    layers: List[LayerActivation] = field(default_factory=list)  # transformer layers
    other_bytes: float = 0.0  # embeddings, projectors, head: never recomputed

    def _tables(self, n: Union[int, Mapping[str, int]]):
        counts = self.stack_layers()
        stacks = sorted(counts)
        return (_StackTables(self, stacks, counts),
                [min(_n_of(n, s), counts[s]) for s in stacks])

    def bytes_with(self, n: Union[int, Mapping[str, int]]) -> float:
        """Activation bytes of the chunk with the first ``n`` layers of each stack (or
        ``n[stack]`` of each) recomputed, over its in-flight micro-batches, plus the one
        recomputed layer whose full activations live again during its backward."""
        tables, ns = self._tables(n)
        return tables.bytes(ns)

    def cost_with(self, n: Union[int, Mapping[str, int]]) -> float:
        """Recompute cost per micro-batch of that choice."""
        tables, ns = self._tables(n)
        return tables.cost(ns)

    def stack_layers(self) -> Dict[str, int]:
        counts: dict = {}
        for layer in self.layers:
            counts[layer.stack] = counts.get(layer.stack, 0) + 1
        return counts

    @property
    def max_stack_layers(self) -> int:
        return max(self.stack_layers().values(), default=0)


@dataclass
class RecomputeChoice(Record):
    # per chunk (chunk order): recompute_num_layers of each stack it holds
    recompute_num_layers: List[Dict[str, int]]
    rank_bytes: List[float]  # static + activation bytes per pipeline rank with that choice
    budget_bytes: float


def choose_recompute(chunks: Sequence[ChunkActivations], static_bytes: Sequence[float],
                     budget_bytes: float) -> RecomputeChoice:
    """Per rank the N per stack that fits ``budget_bytes`` at the least recompute cost
    (ties: fewer bytes); error if even full recompute does not fit."""
    n_per_chunk: List[Dict[str, int]] = [{} for _ in chunks]
    rank_bytes = []
    for rank, static in enumerate(static_bytes):
        mine = [chunks[c] for c in range(len(chunks)) if chunks[c].rank == rank]
        tops: Dict[str, int] = {}
        for ch in mine:
            for stack, count in ch.stack_layers().items():
                tops[stack] = max(tops.get(stack, 0), count)
        stacks = sorted(tops)
        tables = [_StackTables(ch, stacks, tops) for ch in mine]
        best = None  # (cost, bytes, n)
        for ns in itertools.product(*(range(tops[s] + 1) for s in stacks)):
            need = static + sum(t.bytes(ns) for t in tables)
            if need > budget_bytes:
                continue
            key = (sum(t.inflight * t.cost(ns) for t in tables), need)
            if best is None or key < best[:2]:
                best = (*key, dict(zip(stacks, ns)))
        if best is None:
            full = static + sum(ch.bytes_with(tops) for ch in mine)
            raise PlanError(
                f"--recompute-memory-budget {budget_bytes / GB:.3g} GB: pipeline rank {rank} "
                f"needs {full / GB:.3g} GB even with full recompute ({static / GB:.3g} GB "
                "model state); raise the budget or add pipeline stages")
        for c, ch in enumerate(chunks):
            if ch.rank == rank:
                n_per_chunk[c] = {s: best[2][s] for s in ch.stack_layers()}
        rank_bytes.append(best[1])
    return RecomputeChoice(n_per_chunk, rank_bytes, budget_bytes)


class _StackTables:
    """A chunk's ``bytes_with`` and ``cost_with`` for every N of every stack (up to
    ``tops``), as per-stack prefix tables: O(stacks) per choice in the knapsack."""

    def __init__(self, ch: ChunkActivations, stacks: Sequence[str], tops: Mapping[str, int]):
        self.inflight, self.other = ch.inflight, ch.other_bytes
        self.saved, self.peak, self.costs = [], [], []
        for stack in stacks:
            layers = [l for l in ch.layers if l.stack == stack]
            full = sum(l.act_bytes for l in layers)
            saved, peak, cost = [full], [0.0], [0.0]
            for n in range(1, tops[stack] + 1):
                l = layers[n - 1] if n <= len(layers) else None
                saved.append(saved[-1] - (l.act_bytes - l.recompute_act_bytes if l else 0.0))
                peak.append(max(peak[-1], l.act_bytes if l else 0.0))
                cost.append(cost[-1] + (l.recompute_cost if l else 0.0))
            self.saved.append(saved)
            self.peak.append(peak)
            self.costs.append(cost)

    def bytes(self, ns: Sequence[int]) -> float:
        kept = self.other + sum(t[n] for t, n in zip(self.saved, ns))
        return self.inflight * kept + max((t[n] for t, n in zip(self.peak, ns)), default=0.0)

    def cost(self, ns: Sequence[int]) -> float:
        return sum(t[n] for t, n in zip(self.costs, ns))


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
                                                 layer.recompute_act_bytes, layer.fwd_flops))
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
