"""The schedule executor on the separate placement's program (``plan/schedules/
separate.py``): every rank, encoder or LLM, walks its own list of the whole world's program
with the executor's actions (``EF`` / ``EB`` on an encoder rank's chunk, ``F`` / ``B`` on
the LLM's), its messages travelling over the world group between the global ranks
``SeparateRanks`` gives the program's ranks."""

from __future__ import annotations

import torch.distributed as dist

from .executor import ScheduleExecutor
from .separate_placement import SeparateRanks


class SeparateExecutor(ScheduleExecutor):
    """``ScheduleExecutor`` (its arguments after ``ranks``) at this process's rank of the
    separate program."""

    def __init__(self, ranks: SeparateRanks, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ranks = ranks

    def schedule_rank(self) -> int:
        return self.ranks.ir_rank(dist.get_rank())

    def exchange_group(self):
        return dist.group.WORLD

    def peer(self, rank: int) -> int:
        return self.ranks.global_rank(rank)
