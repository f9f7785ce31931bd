"""The schedule executor on the separate placement's program (``plan/schedules/
separate.py``): every rank, encoder or LLM, walks its own list of the whole world's program
with the executor's actions (``EF`` / ``EB`` on an encoder rank's chunk, ``F`` / ``B`` on
the LLM's), its messages travelling over the world group between the global ranks
``SeparateRanks`` gives the program's ranks.

Both sides step as one model: the per-token loss scaling divides every gradient, the
encoder's too, by the tokens of all the LLM's replicas (``loss_tokens``), and the gradient
norm that clipping uses is the one of every parameter once (``global_grad_norm``)."""

from __future__ import annotations

from typing import List

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from ..plan.schedules.separate import check_members
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

    def send_peers(self, rank: int) -> List[int]:
        """An encoder output from the replica's first rank to every TP x CP rank of the
        LLM stage, its gradient from the stage's first rank to every rank of the replica
        (``separate.Members``); LLM messages to the same TP and CP rank."""
        ir, member = self.ranks.ir_member(dist.get_rank())
        return [self.ranks.global_rank(p, j)
                for p, j in self.ranks.members.targets(ir, member, rank)]

    def recv_peer(self, rank: int) -> int:
        ir, member = self.ranks.ir_member(dist.get_rank())
        return self.ranks.global_rank(*self.ranks.members.source(ir, member, rank))

    def program(self, schedule, forward_only: bool):
        """The program, checked for the ranks that run each of its ranks as well
        (``separate.check_members``)."""
        key = (schedule.num_microbatches, forward_only)
        fresh = key not in self._programs
        program = super().program(schedule, forward_only)
        if fresh:
            check_members(schedule, [self.actions(schedule, r, forward_only)
                                     for r in range(schedule.num_ranks)],
                          program, self.ranks.members)
        return program

    def encoder_output_grads(self, inputs: list, grads: list) -> list:
        """Under context parallelism each CP rank's gradient covers its share of the
        sequence: the encoder output's is their sum (an all-reduce over the CP group, which
        every CP rank of the stage runs in this ``B``)."""
        if parallel_state.get_context_parallel_world_size() == 1:
            return grads
        out = []
        for x, g in zip(inputs, grads):
            if x is not None and x.requires_grad:
                g = torch.zeros_like(x) if g is None else g
                dist.all_reduce(g, group=parallel_state.get_context_parallel_group())
            out.append(g)
        return out

    def loss_tokens(self, num_tokens):
        """The LLM replicas' last stages' counts (TP rank 0's; the CP ranks' each of their
        share) summed over the world (every rank takes part, after the program). An LLM
        rank hands finalisation its own count, which Megatron-Core's broadcasts over the
        pipeline and sums over data-parallel (and CP) ranks; an encoder rank the total on
        its first data-parallel rank and zero on the others (finalisation sums them over
        the encoder replicas)."""
        encoder = self.ranks.is_encoder(dist.get_rank())
        last = (not encoder and parallel_state.is_pipeline_last_stage()
                and parallel_state.get_tensor_model_parallel_rank() == 0)  # CP: shares
        group = dist.group.WORLD
        total = torch.zeros((), dtype=torch.int, device=collective_device(group))
        if last:
            total += num_tokens.to(total.device)
        dist.all_reduce(total, group=group)
        if not encoder:
            return num_tokens
        return total if parallel_state.get_data_parallel_rank() == 0 else total * 0


def global_grad_norm(optimizer) -> None:
    """Make ``optimizer`` (Megatron-Core's) reduce its gradient norm over the whole world,
    each parameter counted once (TP duplicates are left out by Megatron-Core, by each
    side's own TP group), so every rank clips by the norm one process would compute. The
    distributed optimizer's ranks each add the squares of their own shard (its
    ``grad_stats_parallel_group``, the instance's ranks, becomes the world); otherwise only
    data-parallel and context-parallel rank 0 of each side adds its squares (its replicas
    hold the same reduced gradients), and of an MoE LLM's experts (an optimizer of their
    own) expert-data-parallel rank 0 (the EP ranks hold different experts)."""
    from megatron.core.optimizer import DistributedOptimizer

    counted = (parallel_state.get_data_parallel_rank() == 0
               and parallel_state.get_context_parallel_rank() == 0)
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        opt.grad_stats_parallel_group = dist.group.WORLD
        if any(g["is_expert_parallel"] for g in opt.param_groups):
            mine = parallel_state.get_expert_data_parallel_rank() == 0
        else:
            mine = counted
        if not mine and not isinstance(opt, DistributedOptimizer):
            opt.get_grads_for_grad_norm = lambda *args, **kwargs: []
