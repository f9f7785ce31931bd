"""The schedule executor on the separate placement's program (``plan/schedules/
separate.py``): every rank, encoder or LLM, walks its own list of the whole world's program
with the executor's actions (``EF`` / ``EB`` on an encoder rank's chunk, ``F`` / ``B`` on
the LLM's), its messages travelling over the world group between the global ranks
``SeparateRanks`` gives the program's ranks.

Both sides step as one model: the per-token loss scaling divides every gradient, the
encoder's too, by the tokens of all the LLM's replicas (``loss_tokens``), and the gradient
norm that clipping uses is the one of every parameter once (``global_grad_norm``)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from .collective_device import collective_device
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

    def loss_tokens(self, num_tokens):
        """The LLM replicas' last stages' counts summed over the world (every rank takes
        part, after the program). An LLM rank hands finalisation its own count, which
        Megatron-Core's broadcasts over the pipeline and sums over data-parallel ranks; an
        encoder rank the total on its first data-parallel rank and zero on the others
        (finalisation sums them over the encoder replicas)."""
        encoder = self.ranks.is_encoder(dist.get_rank())
        last = not encoder and parallel_state.is_pipeline_last_stage()
        group = dist.group.WORLD
        total = torch.zeros((), dtype=torch.int, device=collective_device(group))
        if last:
            total += num_tokens.to(total.device)
        dist.all_reduce(total, group=group)
        if not encoder:
            return num_tokens
        return total if parallel_state.get_data_parallel_rank() == 0 else total * 0


def global_grad_norm(optimizer) -> None:
    """Make ``optimizer`` (Megatron-Core's, not distributed) reduce its gradient norm over
    the whole world, each parameter counted once: data-parallel rank 0 of each side adds
    its squares (its replicas hold the same reduced gradients), so every rank clips by the
    norm one process would compute."""
    counted = parallel_state.get_data_parallel_rank() == 0
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        opt.grad_stats_parallel_group = dist.group.WORLD
        if not counted:
            opt.get_grads_for_grad_norm = lambda *args, **kwargs: []
