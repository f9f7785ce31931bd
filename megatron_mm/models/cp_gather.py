"""Rows of variable count per CP rank gathered into one tensor in a global order, with
the gradient reduce-scattered back to their owners: the K/V gather of the CP attention
and the encoder features of ``--vision-dp-when-cp``."""

from __future__ import annotations

from typing import List

import torch


class PendingGather:
    """An all-gather of [S_local, ...] per rank, started now (``async_op``), finished by
    ``wait`` with the rows in global order."""

    def __init__(self, x: torch.Tensor, counts: List[int], order: torch.Tensor, group):
        self.counts, self.order = counts, order
        padded = x.new_zeros((max(counts),) + x.shape[1:])
        padded[:x.shape[0]] = x.detach()
        self.parts = [torch.empty_like(padded) for _ in counts]
        self.work = torch.distributed.all_gather(self.parts, padded, group=group,
                                                 async_op=True)

    def wait(self) -> torch.Tensor:
        self.work.wait()
        ranked = torch.cat([p[:n] for p, n in zip(self.parts, self.counts)])
        out = torch.empty_like(ranked)
        out[self.order] = ranked
        return out


class GatherSequence(torch.autograd.Function):
    """[S_local, ...] per rank -> [S, ...] in global order (from a ``PendingGather`` of
    ``x``); backward sums the gradients of every rank's copy and returns each owner its
    rows (reduce-scatter)."""

    @staticmethod
    def forward(ctx, x, pending: PendingGather, group):
        ctx.counts, ctx.order, ctx.group = pending.counts, pending.order, group
        return pending.wait()

    @staticmethod
    def backward(ctx, grad):
        counts, group = ctx.counts, ctx.group
        ranked = grad[ctx.order]
        longest = max(counts)
        padded = grad.new_zeros((len(counts), longest) + grad.shape[1:])
        for r, piece in enumerate(torch.split(ranked, counts)):
            padded[r, :counts[r]] = piece
        rank = torch.distributed.get_rank(group)
        if torch.distributed.get_backend(group) == "gloo":  # gloo has no reduce_scatter
            torch.distributed.all_reduce(padded, group=group)
            mine = padded[rank]
        else:
            mine = grad.new_empty(padded.shape[1:])
            torch.distributed.reduce_scatter_tensor(mine, padded.contiguous(), group=group)
        return mine[:counts[rank]], None, None


def gather_rows(x: torch.Tensor, counts: List[int], order: torch.Tensor,
                group) -> torch.Tensor:
    """[counts[rank], ...] on each rank -> [sum(counts), ...] on every rank, row
    ``order[j]`` holding the j-th row of the ranks' rows concatenated in rank order; the
    gradient of each rank's rows is the sum of every rank's gradient of them."""
    return GatherSequence.apply(x, PendingGather(x, counts, order, group), group)
