"""One training iteration on Megatron-Core's schedules (``get_forward_backward_func``)."""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial
from typing import Callable, Iterator, List, NamedTuple, Optional, Sequence, Union

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.utils import get_attr_wrapped_model

from ...models.batch_layout import batch_layout, padding_positions
from ...models.context_parallel import ContextParallelMask
from ...runtime.collective_device import collective_device
from ..assembly.attention import AttentionSettings
from ..assembly.initialize import batch_to_device, device
from .nan_check import grad_norm_checked


CAUSAL = AttentionSettings({})  # no flags: causal, packed samples kept apart


def prepare_batch(batch: dict, model, attention: Optional[AttentionSettings] = None,
                  split: bool = True):
    """(the batch on the device, its attention mask, its ``BatchLayout``) from a batch on
    the host: whatever depends on the batch's values (the mask's codes, this CP rank's
    tokens, media placement and checks, loss positions) is computed here, so the model's
    forward reads no device value; only O(S) tensors cross to the device, without a
    sync (a dense mask is made there from its codes)."""
    dev = device()
    mask = (attention or CAUSAL).mask_for(batch, split=split, device=dev)
    loss_mask = batch.get("loss_mask")
    if isinstance(mask, ContextParallelMask):  # planned on the host
        if loss_mask is not None:
            loss_mask = mask.take_loss_mask(loss_mask)
        mask = mask.to(dev)
    inner = get_attr_wrapped_model(model, "needs_media", return_model_obj=True)
    encoder_cp = (attention or CAUSAL).encoder_cp(split)
    layout = batch_layout(inner.mm_config, inner.media_token_ids, batch["tokens"],
                          batch["media"], loss_mask, encoder_cp)
    if inner.mm_config.language.moe is not None and "seq_lengths" in batch:
        layout.padding = padding_positions(batch["seq_lengths"], batch["tokens"].shape[1])
    # split items: the layout carries this CP rank's media, the only ones it encodes
    media = inner.needs_media() and encoder_cp is None
    return batch_to_device(batch, media=media), mask, layout.to(dev)


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


def run_schedule(config, model: List, data_iterator: Iterator, forward_only: bool,
                 forward_backward: Optional[Callable] = None,
                 attention: Optional[AttentionSettings] = None) -> List[dict]:
    """``forward_backward``: the schedule executor of ``--encoder-schedule coarse|bubble``
    (called like Megatron-Core's schedules); default Megatron-Core's for the layout."""
    forward_backward = forward_backward or get_forward_backward_func()
    return forward_backward(
        forward_step_func=partial(forward_step, attention=attention),
        data_iterator=data_iterator, model=model,
        num_microbatches=config.training.num_microbatches, seq_length=config.model.seq_length,
        micro_batch_size=config.training.micro_batch_size, forward_only=forward_only)


def lm_loss(losses: List[dict]) -> Optional[torch.Tensor]:
    """Token-weighted mean over micro-batches, data- and context-parallel ranks (each CP
    rank holds the loss of its own tokens; last stage only), on the device: one
    all-reduce, no host read. None without losses."""
    if not losses:
        return None
    group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    total = torch.stack([x["lm loss"] for x in losses]).sum(0).to(collective_device(group))
    torch.distributed.all_reduce(total, group=group)
    return total[0] / total[1].clamp(min=1)


def read_on_host(values: Sequence[Union[None, float, torch.Tensor]]) -> List[float]:
    """Scalars as floats, the device ones read in one go (None: NaN)."""
    on_device = [v for v in values if isinstance(v, torch.Tensor)]
    read = iter(torch.stack([v.detach().double().reshape(())
                             for v in on_device]).tolist() if on_device else [])
    return [float("nan") if v is None else next(read) if isinstance(v, torch.Tensor)
            else float(v) for v in values]


def reduce_lm_loss(losses: List[dict]) -> float:
    """``lm_loss`` read on the host (NaN without losses)."""
    return read_on_host([lm_loss(losses)])[0]


class StepResult(NamedTuple):
    # the iteration's lm loss on the device (last pipeline stage; None elsewhere): read
    # it on the host at a log interval (``loss``)
    lm_loss: Optional[torch.Tensor]
    grad_norm: Union[None, float, torch.Tensor]  # Megatron-Core's: a device scalar with TE
    update_successful: bool
    num_zeros_in_grad: Optional[int] = None  # with --log-num-zeros-in-grad

    @property
    def loss(self) -> float:
        """The lm loss on the host (NaN off the last stage): a device sync."""
        return read_on_host([self.lm_loss])[0]


def train_step(config, model: List, optimizer, scheduler, data_iterator: Iterator,
               forward_backward: Optional[Callable] = None,
               attention: Optional[AttentionSettings] = None, timers=None,
               iteration: Optional[int] = None) -> StepResult:
    """One iteration as Megatron-LM's ``train_step``, with no host read of its own: the
    loss stays on the device. ``iteration`` (the one being run) turns on the gradient
    check of ``--check-for-nan-in-loss-and-grad`` (``nan_check.py``); ``timers``
    (Megatron-Core's) time the executor's forward-backward and the optimizer."""
    for chunk in model:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    own_timer = timers is not None and forward_backward is not None  # Megatron-Core's
    if own_timer:  # schedules start 'forward-backward' themselves, the executor does not
        timers("forward-backward", log_level=1).start(barrier=config.logging.barrier_with_L1_time)
    losses = run_schedule(config, model, data_iterator, False, forward_backward, attention)
    if own_timer:
        timers("forward-backward").stop()
    check = iteration is not None and config.exits.check_for_nan_in_loss_and_grad
    if timers is not None:
        timers("optimizer", log_level=1).start(barrier=config.logging.barrier_with_L1_time)
    with grad_norm_checked(optimizer, iteration) if check else nullcontext():
        update_successful, grad_norm, num_zeros = optimizer.step()
    if timers is not None:
        timers("optimizer").stop()
    if update_successful:
        scheduler.step(increment=config.training.global_batch_size)
    loss = lm_loss(losses) if parallel_state.is_pipeline_last_stage() else None
    return StepResult(loss, grad_norm, update_successful, num_zeros)
