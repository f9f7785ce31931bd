"""One training iteration on Megatron-Core's schedules (``get_forward_backward_func``)."""

from __future__ import annotations

from functools import partial
from typing import Callable, Iterator, List, NamedTuple, Optional

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from ..models.context_parallel import ContextParallelMask
from .attention import AttentionSettings
from .initialize import device
from .nan_check import check_loss_and_grads


def batch_to_device(batch: dict) -> dict:
    dev = device()
    out = dict(batch)
    for key in ("tokens", "labels", "loss_mask", "position_ids"):
        out[key] = batch[key].to(dev, non_blocking=True)
    out["media"] = {k: v.to(dev, non_blocking=True) for k, v in batch["media"].items()}
    if "attention_mask" in batch:  # packed samples (--data-balance)
        out["attention_mask"] = batch["attention_mask"].to(dev, non_blocking=True)
    return out


def real_tokens(batch: dict) -> int:
    """Tokens of the batch's samples, padding left out: packed sequences end at their last
    ``cu_seqlens``, padded rows at their ``seq_lengths`` (every position otherwise)."""
    if "cu_seqlens" in batch:
        return int(batch["cu_seqlens"][-1])
    if "seq_lengths" in batch:
        return int(batch["seq_lengths"].sum())
    return batch["tokens"].numel()


class TokenCounter:
    """Wraps a batch iterator and counts the real (non-padding) tokens it hands out."""

    def __init__(self, iterator: Iterator):
        self.iterator, self.tokens = iterator, 0

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        batch = next(self.iterator)
        self.tokens += real_tokens(batch)  # host tensors: the loader's, before the device
        return batch

    def take_global(self) -> int:
        """Tokens seen by all data-parallel ranks since the last call."""
        count = torch.tensor([self.tokens], dtype=torch.float64, device=device())
        torch.distributed.all_reduce(count, group=parallel_state.get_data_parallel_group())
        self.tokens = 0
        return int(count.item())


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Megatron's per-token loss contract: (loss sum, token count, {"lm loss": [sum, count]})."""
    mask = loss_mask.reshape(-1).float()
    loss = torch.sum(output_tensor.reshape(-1).float() * mask)
    num_tokens = mask.sum().to(torch.int)
    report = torch.stack([loss.detach().clone(), num_tokens.float()])
    return loss, num_tokens, {"lm loss": report}


def forward_step(data_iterator: Iterator, model,
                 attention: Optional[AttentionSettings] = None):
    batch = batch_to_device(next(data_iterator))
    mask = batch.get("attention_mask") if attention is None else attention.mask_for(batch)
    output = model(batch["tokens"], batch["position_ids"], batch["media"],
                   labels=batch["labels"], loss_mask=batch["loss_mask"],
                   attention_mask=mask)
    loss_mask = batch["loss_mask"]
    if isinstance(mask, ContextParallelMask):  # the loss of this CP rank's tokens only
        loss_mask = mask.take_loss_mask(loss_mask)
    return output, partial(loss_func, loss_mask)


def run_schedule(args, model: List, data_iterator: Iterator, forward_only: bool,
                 forward_backward: Optional[Callable] = None,
                 attention: Optional[AttentionSettings] = None) -> List[dict]:
    """``forward_backward``: the schedule executor of ``--encoder-schedule coarse|bubble``
    (called like Megatron-Core's schedules); default Megatron-Core's for the layout."""
    forward_backward = forward_backward or get_forward_backward_func()
    return forward_backward(
        forward_step_func=partial(forward_step, attention=attention),
        data_iterator=data_iterator, model=model,
        num_microbatches=args.num_microbatches, seq_length=args.seq_length,
        micro_batch_size=args.micro_batch_size, forward_only=forward_only)


def reduce_lm_loss(losses: List[dict]) -> float:
    """Token-weighted mean over micro-batches, data- and context-parallel ranks (each CP
    rank holds the loss of its own tokens; last stage only)."""
    if not losses:
        return float("nan")
    total = torch.stack([x["lm loss"] for x in losses]).sum(0).to(device())
    torch.distributed.all_reduce(
        total, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    return (total[0] / total[1].clamp(min=1)).item()


class StepResult(NamedTuple):
    loss: float  # the iteration's lm loss (last pipeline stage; NaN elsewhere)
    grad_norm: Optional[float]
    update_successful: bool
    num_zeros_in_grad: Optional[int] = None  # with --log-num-zeros-in-grad


def train_step(args, model: List, optimizer, scheduler, data_iterator: Iterator,
               forward_backward: Optional[Callable] = None,
               attention: Optional[AttentionSettings] = None, timers=None,
               iteration: Optional[int] = None) -> StepResult:
    """One iteration as Megatron-LM's ``train_step``. ``iteration`` (the one being run)
    turns on the NaN/Inf check of ``--check-for-nan-in-loss-and-grad``; ``timers``
    (Megatron-Core's) time the executor's forward-backward and the optimizer."""
    for chunk in model:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    own_timer = timers is not None and forward_backward is not None  # Megatron-Core's
    if own_timer:  # schedules start 'forward-backward' themselves, the executor does not
        timers("forward-backward", log_level=1).start(barrier=args.barrier_with_L1_time)
    losses = run_schedule(args, model, data_iterator, False, forward_backward, attention)
    if own_timer:
        timers("forward-backward").stop()
    if iteration is not None and args.check_for_nan_in_loss_and_grad:
        check_loss_and_grads(model, losses, iteration)
    if timers is not None:
        timers("optimizer", log_level=1).start(barrier=args.barrier_with_L1_time)
    update_successful, grad_norm, num_zeros = optimizer.step()
    if timers is not None:
        timers("optimizer").stop()
    if update_successful:
        scheduler.step(increment=args.global_batch_size)
    loss = reduce_lm_loss(losses) if parallel_state.is_pipeline_last_stage() else float("nan")
    return StepResult(loss, grad_norm, update_successful, num_zeros)
