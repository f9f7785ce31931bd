"""``--check-for-nan-in-loss-and-grad`` (on by default, as in Megatron-LM), without a
pass over the gradients or a host read of its own.

Gradients: Megatron-Core's optimizer computes the gradient norm at every step
(``ChainedOptimizer.step`` calls ``get_grad_norm`` before it clips or updates anything):
one fused reduction (``multi_tensor_l2norm``) over the gradients, all-reduced over the
ranks that hold them, the same value on every rank. A NaN or Inf in any gradient makes
it non-finite (Megatron-LM checks each DDP bucket's norm the same way, before its
all-reduce). So the check reads that norm as the optimizer returns it, and every rank
stops together, naming the iteration, before a non-finite update is applied. Without
Transformer Engine, Megatron-Core has already brought the norm to the host
(``get_grad_norm_fp32``); with it the norm stays on the device and this read is the one
host read per iteration the flag costs.

Loss: read on the host only at the log interval (``--log-interval``), where the
iteration line reads it anyway; the first non-finite iteration of the interval is agreed
on by every rank (one all-reduce), so all of them stop with the same message.
"""

from __future__ import annotations

import contextlib
import math
from typing import Mapping

import torch
from megatron.core.optimizer import ChainedOptimizer

from ...runtime.collective_device import collective_device


class NonFiniteError(RuntimeError):
    """A NaN or Inf in the loss or the gradients."""


def _stop(iteration: int, what: str, when: str) -> NonFiniteError:
    return NonFiniteError(
        f"iteration {iteration}: found NaN or Inf in {what} "
        f"(--check-for-nan-in-loss-and-grad); stopping {when}. "
        f"Lower --lr, check the data, or resume from the last checkpoint")


@contextlib.contextmanager
def grad_norm_checked(optimizer, iteration: int):
    """Within it, ``optimizer.step()`` raises NonFiniteError on every rank when the
    gradient norm it computes is NaN or Inf, before it clips or updates."""
    if not isinstance(optimizer, ChainedOptimizer):  # get_megatron_optimizer's kind
        raise TypeError(f"--check-for-nan-in-loss-and-grad reads the gradient norm "
                        f"ChainedOptimizer.step computes; got {type(optimizer).__name__}")
    compute = optimizer.get_grad_norm

    def checked():
        norm = compute()
        value = float(norm)  # a host float already, or one device scalar (TE)
        if not math.isfinite(value):
            raise _stop(iteration, f"the gradients (their norm is {value})",
                        "before the optimizer step")
        return norm

    optimizer.get_grad_norm = checked  # ChainedOptimizer.step calls self.get_grad_norm()
    try:
        yield
    finally:
        del optimizer.get_grad_norm


def check_losses(losses: Mapping[int, float]) -> None:
    """At a log interval, on every rank (a collective): raises NonFiniteError naming the
    first iteration whose loss (``losses``: read on the last pipeline stage; empty
    elsewhere) is NaN or Inf."""
    none = torch.iinfo(torch.int64).max
    bad = [it for it, loss in losses.items() if not math.isfinite(loss)]
    first = torch.tensor([min(bad, default=none)], dtype=torch.int64,
                         device=collective_device())
    torch.distributed.all_reduce(first, op=torch.distributed.ReduceOp.MIN)
    if int(first.item()) != none:
        raise _stop(int(first.item()), "the loss", "at the log interval")
