"""Stage partitions of the chain: frozen-aware min-max, Megatron's uniform, or explicit.

``--pipeline-partition`` takes
- ``auto``: exact min-max over contiguous splits of the chain into PP x VPP chunks, each
  layer weighted by its frozen-aware cost (F + the backward parts that actually run),
  under a per-stage memory limit;
- ``uniform``: what Megatron-Core does: every encoder and projector on the first chunk with
  the LLM embedding, LLM layers split evenly over the chunks, output layer on the last;
- ``balanced``: the freeze-unaware min-max baseline (Optimus' "Megatron-LM balanced"): the
  same DP, but every layer weighted 3F (4F with recompute) as if everything trained;
- ``search``: OmniBal's BMP (``partition_search``): candidates within +-r layers of a
  greedy anchor, ranked by rank-time variance and boundary bytes; here the best-ranked one,
  the training runtime times the top few on the real model and keeps the fastest;
- ``encoder-first-stage``: ``auto``'s min-max with every encoder and projector (all that
  comes before the first LLM decoder layer) on the first chunk, as stock Megatron-LM's
  ``LLaVAModel`` and MIMO build them (``megatron_lm_args`` prints its flags);
- a list ``4,8,8,8``: layers per chunk, in chunk order, counting every chain entry
  (embeddings, projectors and the output layer are layers here).

Chunk c of the PP x VPP contiguous chunks runs on pipeline rank c % PP, as in Megatron's
interleaving (rank r holds chunks r, r + PP, r + 2 PP, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

from ..costs.hardware import Hardware, MemoryModel
from ..errors import PlanError
from ..record import Record
from .layers import Layer
from .memory import ChunkMemory, stage_memory
from .minmax import minmax_split, prefix_sums
from .partition_search import candidates, layer_times

POLICIES = ("auto", "uniform", "balanced", "search", "encoder-first-stage")
GiB = 1024 ** 3


@dataclass
class StagePartition(Record):
    """Layers per chunk; chunk c = v * PP + r is virtual stage v of pipeline rank r."""

    pipeline_model_parallel_size: int
    virtual_pipeline_model_parallel_size: int
    layers_per_chunk: List[int]
    policy: str = "explicit"

    def __post_init__(self):
        pp, vpp = self.pipeline_model_parallel_size, self.virtual_pipeline_model_parallel_size
        if pp < 1 or vpp < 1:
            raise PlanError(f"pipeline sizes must be >= 1, got PP={pp}, VPP={vpp}")
        if len(self.layers_per_chunk) != pp * vpp:
            raise PlanError(f"a partition for PP={pp} x VPP={vpp} needs {pp * vpp} entries, "
                            f"got {len(self.layers_per_chunk)}: {self.layers_per_chunk}")
        if min(self.layers_per_chunk) < 1:
            raise PlanError(f"every pipeline stage needs at least one layer, got "
                            f"{self.layers_per_chunk}")

    @property
    def num_chunks(self) -> int:
        return len(self.layers_per_chunk)

    @property
    def num_layers(self) -> int:
        return sum(self.layers_per_chunk)

    def rank_of_chunk(self, chunk: int) -> int:
        return chunk % self.pipeline_model_parallel_size

    def chunks_of_rank(self, rank: int) -> List[int]:
        pp = self.pipeline_model_parallel_size
        return [rank + v * pp for v in range(self.virtual_pipeline_model_parallel_size)]

    def chunk_bounds(self) -> List[List[int]]:
        """[start, end) layer indices of each chunk."""
        ends = prefix_sums(self.layers_per_chunk)
        return [[int(ends[c]), int(ends[c + 1])] for c in range(self.num_chunks)]

    @property
    def layers_per_stage(self) -> List[List[int]]:
        """Per pipeline rank, the layer count of each of its virtual chunks."""
        return [[self.layers_per_chunk[c] for c in self.chunks_of_rank(r)]
                for r in range(self.pipeline_model_parallel_size)]

    def layer_ranks(self) -> List[int]:
        """The pipeline rank of every layer of the chain."""
        return [self.rank_of_chunk(c) for c, n in enumerate(self.layers_per_chunk)
                for _ in range(n)]


def parse_partition_flag(text: str) -> Union[str, List[int]]:
    """``auto`` | ``uniform`` | ``balanced`` | ``search`` | ``4,8,8,8`` (layers per stage)
    -> policy."""
    value = text.strip().lower()
    if value in POLICIES:
        return value
    try:
        counts = [int(part) for part in value.split(",")]
    except ValueError:
        raise PlanError(f"--pipeline-partition must be auto, uniform, balanced, search or a "
                        f"comma-separated list of layers per stage such as 4,8,8,8 (or "
                        f"encoder-first-stage: every encoder on the first stage); "
                        f"got {text!r}") from None
    if min(counts) < 1:
        raise PlanError(f"--pipeline-partition {text}: every stage needs at least one layer")
    return counts


def partition(chain: Sequence[Layer], pp: int, vpp: int = 1,
              policy: Union[str, Sequence[int]] = "auto",
              memory_limit_bytes: Optional[float] = None, *,
              num_microbatches: Optional[int] = None,
              memory: Optional[MemoryModel] = None, search_radius: int = 1,
              hardware: Optional[Hardware] = None) -> StagePartition:
    """Split ``chain`` into PP x VPP chunks by ``policy`` (a name or layers per chunk).

    ``memory_limit_bytes`` bounds every rank (parameters, gradients, optimizer state and
    in-flight activations; ``num_microbatches`` caps the in-flight count). ``auto`` searches
    within it; the other policies are checked against it. With VPP > 1 the search asks each
    chunk to fit limit / VPP (a rank's memory is the sum of its chunks), so it is exact for
    VPP = 1 and conservative otherwise. ``auto`` and ``search`` weigh layers by
    ``layer_times`` (``hardware``: what the chain's costs are in; default FLOPs).
    """
    memory = memory or MemoryModel()
    if pp < 1 or vpp < 1:
        raise PlanError(f"--pipeline-model-parallel-size ({pp}) and "
                        f"--virtual-pipeline-model-parallel-size ({vpp}) must be >= 1")
    chunks = pp * vpp
    if len(chain) < chunks:
        raise PlanError(f"the chain has {len(chain)} layers, fewer than PP x VPP = {chunks} "
                        "pipeline stages; lower --pipeline-model-parallel-size")
    if isinstance(policy, str):
        policy = parse_partition_flag(policy)
    if policy == "search":
        best = candidates(chain, pp, vpp, search_radius, hardware=hardware)[0]
        result = StagePartition(pp, vpp, best.layers_per_chunk, "search")
        if memory_limit_bytes is not None:
            check_memory(chain, result, memory_limit_bytes, num_microbatches, memory)
        return result
    if isinstance(policy, str) and policy != "uniform":
        times = layer_times(chain, hardware)
        weights = [t if policy != "balanced" else (4.0 if l.recompute else 3.0) * l.fwd_flops
                   for t, l in zip(times, chain)]
        counts = _minmax(chain, weights, pp, vpp, memory_limit_bytes, num_microbatches, memory,
                         first_end=(first_llm_layer(chain) if policy == "encoder-first-stage"
                                    else 0))
        return StagePartition(pp, vpp, counts, policy)
    if policy == "uniform":
        counts, name = uniform_counts(chain, chunks), "uniform"
    else:
        counts, name = list(policy), "explicit"
        if len(counts) != chunks:
            raise PlanError(f"--pipeline-partition lists {len(counts)} stages, but PP x VPP = "
                            f"{pp} x {vpp} = {chunks}; give one layer count per stage")
        if sum(counts) != len(chain):
            raise PlanError(f"--pipeline-partition counts sum to {sum(counts)}, but the chain "
                            f"has {len(chain)} layers ({_composition(chain)})")
    result = StagePartition(pp, vpp, counts, name)
    if memory_limit_bytes is not None:
        check_memory(chain, result, memory_limit_bytes, num_microbatches, memory)
    return result


def uniform_counts(chain: Sequence[Layer], chunks: int) -> List[int]:
    """Megatron-Core's layout: LLM decoder layers split evenly over the chunks; everything
    before them (encoders, projectors, LLM embedding) joins the first chunk, the output
    layer the last. Megatron-Core requires the layers to divide evenly; when they do not,
    the first chunks take one more, as Cornstarch's Megatron-style template does."""
    llm = [i for i, l in enumerate(chain) if l.kind == "llm_layer"]
    if len(llm) < chunks:
        raise PlanError(f"uniform partition: {len(llm)} LLM layers cannot fill PP x VPP = "
                        f"{chunks} stages; use --pipeline-partition auto")
    base, extra = divmod(len(llm), chunks)
    counts = [base + (1 if c < extra else 0) for c in range(chunks)]
    counts[0] += llm[0]
    counts[-1] += len(chain) - 1 - llm[-1]
    return counts


def check_memory(chain: Sequence[Layer], part: StagePartition, limit: float,
                 num_microbatches: Optional[int], memory: MemoryModel) -> None:
    pp, vpp = part.pipeline_model_parallel_size, part.virtual_pipeline_model_parallel_size
    params, acts, _ = stage_memory(chain, part.chunk_bounds(), pp, vpp, num_microbatches,
                                   memory)
    for rank, (p, a) in enumerate(zip(params, acts)):
        if p + a > limit:
            raise PlanError(
                f"{part.policy} partition {part.layers_per_chunk}: pipeline stage {rank} needs "
                f"{(p + a) / GiB:.3g} GiB ({p / GiB:.3g} model state + {a / GiB:.3g} "
                f"activations), over the memory limit of {limit / GiB:.3g} GiB per stage "
                "(--memory-limit-gb); use --pipeline-partition auto, more stages, or "
                "--recompute-granularity full")


def first_llm_layer(chain: Sequence[Layer]) -> int:
    """The index of the first LLM decoder layer (everything before it: the LLM embedding,
    the encoders, the projectors)."""
    first = next((i for i, l in enumerate(chain) if l.kind == "llm_layer"), None)
    if first is None:
        raise PlanError("--pipeline-partition encoder-first-stage: the chain has no LLM "
                        "decoder layer")
    return first


def _minmax(chain, weights, pp, vpp, limit, num_microbatches, memory,
            first_end: int = 0) -> List[int]:
    """``first_end``: the first chunk ends at that layer or later (``encoder-first-stage``:
    the encoders and projectors all on it)."""
    chunks = pp * vpp
    time = prefix_sums(weights)

    def cost(start, end, _chunk):
        return time[end] - time[start]

    mem = ChunkMemory(chain, pp, vpp, num_microbatches, memory) if limit is not None else None
    per_chunk = limit / vpp if limit is not None else None

    def feasible(start, end, chunk):
        if chunk == 0 and end < first_end:
            return False
        return mem is None or mem(start, end, chunk) <= per_chunk

    if limit is None and not first_end:
        feasible = None
    _, counts = minmax_split(len(chain), chunks, cost, feasible)
    if counts is None and limit is None:
        raise PlanError(f"--pipeline-partition encoder-first-stage: the {first_end} layers "
                        f"before the first LLM decoder layer leave too few for PP x VPP = "
                        f"{chunks} stages")
    if counts is None:
        best, _ = minmax_split(len(chain), chunks, mem)
        per = " per model chunk (limit / VPP)" if vpp > 1 else ""
        raise PlanError(
            f"no split of the {len(chain)}-layer chain into PP x VPP = {chunks} stages fits "
            f"the memory limit of {limit / GiB:.3g} GiB per stage (--memory-limit-gb): the "
            f"best split needs {best / GiB:.3g} GiB{per} on its fullest stage; raise the "
            "limit, add pipeline stages, or use --recompute-granularity full")
    return counts


def _composition(chain: Sequence[Layer]) -> str:
    kinds: dict = {}
    for layer in chain:
        kinds[layer.kind] = kinds.get(layer.kind, 0) + 1
    return " + ".join(f"{n} {kind}" for kind, n in kinds.items())
