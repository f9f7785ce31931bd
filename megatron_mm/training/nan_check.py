"""``--check-for-nan-in-loss-and-grad`` (on by default, as in Megatron-LM): after the
backward, before the optimizer applies anything, every rank learns whether any rank's
loss or gradients hold a NaN or Inf, and the run stops naming the iteration.

Megatron-LM checks each data-parallel bucket before its all-reduce, on the rank that sees
it; here one flag is all-reduced over the world after the schedule, so all ranks stop
together with the same message instead of one rank raising while the others wait.
"""

from __future__ import annotations

from typing import List

import torch

from ..runtime.collective_device import collective_device


class NonFiniteError(RuntimeError):
    """A NaN or Inf in the loss or the gradients."""


def _grad_buffers(model_chunks):
    for chunk in model_chunks:  # Megatron-Core DDP: main_grad views into these buffers
        for buffer in list(getattr(chunk, "buffers", [])) + list(
                getattr(chunk, "expert_parallel_buffers", [])):
            yield buffer.grad_data


def check_loss_and_grads(model_chunks, losses: List[dict], iteration: int) -> None:
    """Raises NonFiniteError on every rank when any rank has a non-finite loss (last
    pipeline stage) or gradient. One all-reduce and one host read per iteration."""
    bad = torch.zeros(2, dtype=torch.float32, device=collective_device())
    for grads in _grad_buffers(model_chunks):
        bad[1] += (~torch.isfinite(grads)).any().float()
    for report in losses:
        bad[0] += (~torch.isfinite(report["lm loss"].to(bad.device))).any().float()
    torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
    loss_bad, grad_bad = bad.tolist()
    if loss_bad or grad_bad:
        what = " and ".join(name for name, flag in (("the loss", loss_bad),
                                                      ("the gradients", grad_bad)) if flag)
        raise NonFiniteError(
            f"iteration {iteration}: found NaN or Inf in {what} "
            f"(--check-for-nan-in-loss-and-grad); stopping before the optimizer step. "
            f"Lower --lr, check the data, or resume from the last checkpoint")
