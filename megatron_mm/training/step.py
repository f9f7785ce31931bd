"""One training iteration on Megatron-Core's schedules (``get_forward_backward_func``)."""

from __future__ import annotations

from functools import partial
from typing import Callable, Iterator, List, NamedTuple, Optional

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.utils import get_attr_wrapped_model

from ..models.batch_layout import batch_layout
from ..models.context_parallel import ContextParallelMask
from ..runtime.collective_device import collective_device
from .attention import AttentionSettings
from .initialize import device
from .nan_check import check_loss_and_grads


def batch_to_device(batch: dict, media: bool = True) -> dict:
    """The model's inputs on the device; the media only where the model chunk reads them
    (``media=False``: an empty dict, the layout carries their counts)."""
    dev = device()
    out = dict(batch)
    for key in ("tokens", "labels", "loss_mask", "position_ids"):
        out[key] = batch[key].to(dev, non_blocking=True)
    out["media"] = ({k: v.to(dev, non_blocking=True) for k, v in batch["media"].items()}
                    if media else {})
    if "attention_mask" in batch:  # packed samples (--data-balance)
        out["attention_mask"] = batch["attention_mask"].to(dev, non_blocking=True)
    return out


def prepare_batch(batch: dict, model, attention: Optional[AttentionSettings] = None,
                  split: bool = True):
    """(the batch on the device, its attention mask, its ``BatchLayout``) from a batch on
    the host: whatever depends on the batch's values (the mask, this CP rank's tokens,
    media placement and checks, loss positions) is computed here, before the copy, so
    the model's forward reads no device value."""
    mask = (batch.get("attention_mask") if attention is None
            else attention.mask_for(batch, split=split))
    loss_mask = batch.get("loss_mask")
    if isinstance(mask, ContextParallelMask) and loss_mask is not None:
        loss_mask = mask.take_loss_mask(loss_mask)
    inner = get_attr_wrapped_model(model, "needs_media", return_model_obj=True)
    layout = batch_layout(inner.mm_config, inner.media_token_ids, batch["tokens"],
                          batch["media"], loss_mask)
    dev = device()
    return (batch_to_device(batch, media=inner.needs_media()),
            None if mask is None else mask.to(dev), layout.to(dev))


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
        group = parallel_state.get_data_parallel_group()
        count = torch.tensor([self.tokens], dtype=torch.float64,
                             device=collective_device(group))
        torch.distributed.all_reduce(count, group=group)
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
    batch, mask, layout = prepare_batch(next(data_iterator), model, attention)
    output = model(batch["tokens"], batch["position_ids"], batch["media"],
                   labels=batch["labels"], loss_mask=batch["loss_mask"],
                   attention_mask=mask, layout=layout)
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
    group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    total = torch.stack([x["lm loss"] for x in losses]).sum(0).to(collective_device(group))
    torch.distributed.all_reduce(total, group=group)
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
