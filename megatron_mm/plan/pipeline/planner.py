"""A pipeline plan: the chain, its partition and their estimate, as one JSON-able record.

This is what a runtime executes (which modules each rank builds) and what a simulator
replays (the per-layer costs it needs are in the chain).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

from ..costs.hardware import Hardware, MemoryModel
from ..record import Record
from .estimate import PipelineEstimate, estimate
from .layers import Layer
from .partition import StagePartition, partition


@dataclass
class PipelinePlan(Record):
    chain: List[Layer]
    partition: StagePartition
    estimate: PipelineEstimate
    hardware: Hardware
    memory: MemoryModel

    def modules_of_rank(self, rank: int) -> List[List[str]]:
        """Per local chunk of ``rank``, the module names it builds."""
        bounds = self.partition.chunk_bounds()
        return [[l.module for l in self.chain[slice(*bounds[c])]]
                for c in self.partition.chunks_of_rank(rank)]


def plan_pipeline(chain: Sequence[Layer], pp: int, vpp: int = 1,
                  policy: Union[str, Sequence[int]] = "auto", num_microbatches: int = 1,
                  hardware: Optional[Hardware] = None, memory: Optional[MemoryModel] = None,
                  memory_limit_bytes: Optional[float] = None) -> PipelinePlan:
    hardware, memory = hardware or Hardware(), memory or MemoryModel()
    part = partition(chain, pp, vpp, policy, memory_limit_bytes,
                     num_microbatches=num_microbatches, memory=memory)
    return PipelinePlan(chain=list(chain), partition=part,
                        estimate=estimate(chain, part, num_microbatches, hardware, memory),
                        hardware=hardware, memory=memory)
