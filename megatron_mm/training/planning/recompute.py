"""Which layers each model chunk recomputes: Megatron's flags, or adaptive under a budget.

``--recompute-granularity`` / ``--recompute-method`` / ``--recompute-num-layers`` apply to
every chunk as in Megatron-LM. ``--recompute-memory-budget`` (GB per rank) picks per rank
the block N of each transformer stack (``plan.recompute_budget``: the least recompute time
that fits) from the chain's activation bytes and forward costs: measured ones
where ``--pipeline-profile`` has them (saved-tensor hooks, ``tools/profile_layers.py``),
the cost model's otherwise.
"""

from __future__ import annotations

from ...plan import MemoryModel, StagePartition
from ...plan.pipeline.recompute_budget import (GB, RecomputeChoice, choose_recompute,
                                     chunk_activations, static_bytes)
from .chain import training_chain


def adaptive_choice(config, part: StagePartition, chain=None) -> RecomputeChoice:
    chain = chain if chain is not None else training_chain(config)
    bounds = part.chunk_bounds()
    pp, vpp = part.pipeline_model_parallel_size, part.virtual_pipeline_model_parallel_size
    m = config.training.num_microbatches
    return choose_recompute(chunk_activations(chain, bounds, pp, vpp, m),
                            static_bytes(chain, bounds, pp, MemoryModel()),
                            config.recompute.recompute_memory_budget * GB)


def describe_choice(config, part: StagePartition, chain=None) -> str:
    return choice_line(config, adaptive_choice(config, part, chain))


def choice_line(config, choice: RecomputeChoice) -> str:
    source = ("measured" if config.pipeline.pipeline_profile else "cost-model")
    budget = config.recompute.recompute_memory_budget
    return (f"> adaptive recompute (budget {budget:g} GB per rank, "
            f"{source} activation bytes and times): recompute_num_layers per chunk "
            f"{choice.recompute_num_layers}, estimated GB per rank "
            f"{[round(b / GB, 4) for b in choice.rank_bytes]}")
