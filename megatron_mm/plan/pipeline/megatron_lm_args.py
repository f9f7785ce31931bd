"""The planner's choice as the flags of a stock Megatron-LM run.

A ``PipelinePlan`` partitions the whole chain (LLM embedding, encoders, projectors, LLM
decoder layers, output layer); stock Megatron-LM's multimodal models (``LLaVAModel``,
MIMO) build every encoder and projector on the first pipeline stage and partition the
LLM only. So a plan carries over when its first chunk holds everything before the first
LLM decoder layer (``--pipeline-partition encoder-first-stage`` plans so); its LLM decoder
layers per chunk then become:

- ``--pipeline-model-parallel-layout``: Megatron-Core's string form
  (``transformer/pipeline_parallel_layer_layout.py``): one ``|``-separated stage per
  chunk in chunk order (virtual stage v of rank r is stage v x PP + r), ``E`` the
  embedding, ``t`` a decoder layer (``t*8``: eight), ``L`` the loss; always exact;
- ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` where
  they suffice (Megatron-Core's uneven split: the first / last stage so many layers, the
  stages between an equal share of the rest, each rank's split evenly over its virtual
  stages, ``--num-virtual-stages-per-pipeline-rank``); nothing at all where the split is
  Megatron-Core's even one;
- recompute: ``--recompute-granularity full`` with ``--recompute-method uniform
  --recompute-num-layers 1`` when every LLM layer recomputes, ``--recompute-method block
  --recompute-num-layers N`` when every chunk recomputes its first N (an adaptive choice,
  ``recompute_budget.RecomputeChoice``); Megatron-LM has one N for every chunk, so chunks
  that differ get the largest (never less memory saved than planned) and a note says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from ..errors import PlanError
from ..record import Record
from .layers import LLM, Layer
from .partition import StagePartition


@dataclass
class MegatronLMArgs(Record):
    """The flags (``flags()``: the shortest exact form; ``layout_flags()``: the explicit
    layout) and what they cannot say (``notes``)."""

    pipeline_model_parallel_size: int
    virtual_pipeline_model_parallel_size: int
    decoder_layers_per_chunk: List[int]
    pipeline_model_parallel_layout: str
    # None: the first / last stage counts do not describe the split
    uneven_flags: Optional[List[str]] = None
    recompute_flags: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def layout_flags(self) -> List[str]:
        return (self._parallel(virtual=False) + ["--pipeline-model-parallel-layout",
                                                 self.pipeline_model_parallel_layout]
                + self.recompute_flags)

    def flags(self) -> List[str]:
        if self.uneven_flags is None:
            return self.layout_flags()
        return self._parallel(virtual=True) + self.uneven_flags + self.recompute_flags

    def _parallel(self, virtual: bool) -> List[str]:
        out = ["--pipeline-model-parallel-size", str(self.pipeline_model_parallel_size)]
        if virtual and self.virtual_pipeline_model_parallel_size > 1:
            out += ["--num-virtual-stages-per-pipeline-rank",
                    str(self.virtual_pipeline_model_parallel_size)]
        return out


def megatron_lm_args(chain: Sequence[Layer], part: StagePartition,
                     recompute_num_layers: Optional[Sequence[dict]] = None) -> MegatronLMArgs:
    """``part`` of ``chain`` as Megatron-LM flags (module docstring);
    ``recompute_num_layers``: per chunk, each stack's recomputed layers
    (``RecomputeChoice.recompute_num_layers``); None: the chain's own ``recompute``."""
    pp, vpp = part.pipeline_model_parallel_size, part.virtual_pipeline_model_parallel_size
    bounds = part.chunk_bounds()
    first = next((i for i, l in enumerate(chain) if l.kind == "llm_layer"), None)
    if first is None:
        raise PlanError("the chain has no LLM decoder layer: nothing for Megatron-LM's "
                        "pipeline layout")
    if bounds[0][1] < first:
        spilled = sorted({l.branch for l in chain[bounds[0][1]:first]})
        raise PlanError(f"the partition {part.layers_per_chunk} puts {spilled} layers past "
                        "the first pipeline stage; stock Megatron-LM (LLaVAModel, MIMO) "
                        "builds every encoder and projector there: plan with "
                        "--pipeline-partition encoder-first-stage")
    counts = [sum(1 for l in chain[s:e] if l.kind == "llm_layer") for s, e in bounds]
    out = llm_layout_args(counts, pp, vpp)
    out.recompute_flags, out.notes = _recompute(chain, bounds, recompute_num_layers)
    return out


def llm_layout_args(counts: Sequence[int], pp: int, vpp: int) -> MegatronLMArgs:
    """The flags that give Megatron-Core's GPT ``counts`` decoder layers per chunk (chunk
    v x PP + r), the embedding on the first and the loss on the last."""
    stages = []
    for c, n in enumerate(counts):
        text = ("E" if c == 0 else "") + ("t" * n if n < 2 else f"t*{n}")
        stages.append(text + ("L" if c == len(counts) - 1 else ""))
    counts = list(counts)
    return MegatronLMArgs(pp, vpp, counts, "|".join(stages), _uneven(counts, pp, vpp))


def _uneven(counts: List[int], pp: int, vpp: int) -> Optional[List[str]]:
    """The first / last stage flags that give ``counts`` (per chunk) in Megatron-Core's
    uneven split (``get_num_layers_to_build``), [] for its even split, None if none do."""
    per_rank = [[counts[v * pp + r] for v in range(vpp)] for r in range(pp)]
    if any(len(set(chunks)) > 1 for chunks in per_rank):
        return None  # Megatron-Core splits each rank evenly over its virtual stages
    ranks = [chunks[0] * vpp for chunks in per_rank]
    options = [([], ranks), (["first"], ranks[1:]), (["last"], ranks[:-1]),
               (["first", "last"], ranks[1:-1])]
    for given, middle in options:
        if pp == 1 and given:
            continue
        # Megatron-Core's TransformerConfig: a stage the counts give holds a layer
        empty = (middle and middle[0] == 0) or ("first" in given and ranks[0] == 0) or (
            "last" in given and ranks[-1] == 0)
        if len(set(middle)) <= 1 and (middle or given) and not empty:
            flags = []
            if "first" in given:
                flags += ["--decoder-first-pipeline-num-layers", str(ranks[0])]
            if "last" in given:
                flags += ["--decoder-last-pipeline-num-layers", str(ranks[-1])]
            return flags
    return None


def _recompute(chain: Sequence[Layer], bounds, per_chunk) -> tuple:
    llm = [[l for l in chain[s:e] if l.kind == "llm_layer"] for s, e in bounds]
    if per_chunk is None:
        flags = [l.recompute for c in llm for l in c]
        if flags and all(flags):
            return (["--recompute-granularity", "full", "--recompute-method", "uniform",
                     "--recompute-num-layers", "1"], [])
        if any(flags):
            raise PlanError("the chain recomputes some LLM layers only; give the choice per "
                            "chunk (recompute_num_layers)")
        return [], []
    ns = [chunk.get(LLM, 0) for chunk in per_chunk]
    notes = [f"encoder {stack!r} recomputes {[chunk.get(stack, 0) for chunk in per_chunk]} "
             "layers per chunk: Megatron-LM's recompute flags set the LLM's "
             "TransformerConfig" for stack in sorted({s for chunk in per_chunk for s in chunk}
                                                     - {LLM})
             if any(chunk.get(stack, 0) for chunk in per_chunk)]
    if not any(ns):
        return [], notes
    if all(n == len(c) for n, c in zip(ns, llm)):
        return (["--recompute-granularity", "full", "--recompute-method", "uniform",
                 "--recompute-num-layers", "1"], notes)
    if len(set(ns)) > 1:
        notes.append(f"the plan recomputes {ns} LLM layers per chunk; Megatron-LM's "
                     f"--recompute-num-layers is one count for every chunk: {max(ns)}")
    return (["--recompute-granularity", "full", "--recompute-method", "block",
             "--recompute-num-layers", str(max(ns))], notes)
