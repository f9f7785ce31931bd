"""Which layers each pipeline stage holds, and the partition search."""

from dataclasses import dataclass
from typing import List, Optional

from ....config import ConfigError
from .fields import flag, flag_name


@dataclass(frozen=True)
class PipelineArgs:
    """Which layers each pipeline stage holds, and the partition search."""

    pipeline_partition: str = "uniform"
    """which layers each pipeline stage holds: uniform (Megatron-Core: encoders on the first stage,
    LLM layers split evenly), auto (frozen-aware min-max over encoder, projector and LLM
    layers), balanced (min-max as if everything trained), search (OmniBal: time the best-ranked
    partitions near a greedy anchor, keep the fastest), or layers per stage in chunk order, e.g.
    6,4 (tools/plan.py lists the chain)"""
    pipeline_search_radius: int = 1
    """--pipeline-partition search: candidates move each stage boundary of the anchor by up to this
    many layers"""
    pipeline_search_candidates: int = 3
    """--pipeline-partition search: how many best-ranked candidates are timed on the real model"""
    pipeline_search_iters: int = 3
    """--pipeline-partition search: training iterations timed per candidate (their median; the max
    over ranks)"""
    memory_limit_gb: Optional[float] = None
    """memory per pipeline stage the partition must fit (the planner's memory model: weights,
    gradients, optimizer state, in-flight activations)"""
    pipeline_profile: Optional[str] = flag(None, metavar="FILE")
    """measured per-layer times (tools/profile_layers.py) for --pipeline-partition auto, instead of
    the FLOP cost model"""

    def errors(self) -> List[ConfigError]:
        """This group's own checks, each naming its flag."""
        out = [ConfigError(f"{flag_name(n)} must be >= 1")
               for n in ("pipeline_search_candidates", "pipeline_search_iters")
               if getattr(self, n) < 1]
        if self.pipeline_search_radius < 0:
            out.append(ConfigError("--pipeline-search-radius must be >= 0"))
        return out
