"""Megatron-LM's ``forward_step(data_iterator, model)`` for the package's model and data.

Data convention: every pipeline stage reads its own copy of each micro-batch (the
datasets provider gives every rank an iterator, ``is_distributed``), not only the first
and last stages as Megatron-LM's ``get_batch`` does: a chunk needs the batch's layout (its
media and their placeholder positions) to know the shapes it receives and to merge the
features; within a stage the first tensor-parallel rank reads them, the others receive
them by broadcast (``datasets``). The loss is Megatron-LM's per-token contract ``(loss sum,
token count, {"lm loss": [sum, count]})``; with ``--calculate-per-token-loss`` the
iteration's loss is the token mean over the global batch, as ``examples/pretrain_mllm.py``
computes it.

``get_batch`` is the read (and the broadcast), timed as Megatron-LM's ``pretrain_gpt.py``
times its own: ``batch-generator`` covers the batch fetch only, not the forward.

Without ``--calculate-per-token-loss`` Megatron-Core divides each micro-batch's loss by its
token count and averages over micro-batches and data-parallel ranks: the mean of the
micro-batches' token means, whatever the context-parallel size. Its division is by each
CP rank's own count, though, and a multimodal sample's answer tokens (the only ones with a
loss) often all fall on one CP rank, so each rank's share of the micro-batch is scaled to
the micro-batch's count instead (``_micro_batch_mean``): the gradient equals the CP=1
run's.
"""

from __future__ import annotations

from functools import partial

import torch

from ..training.loop.step import forward_step as _forward_step
from .context import run_context


def get_batch(data_iterator) -> dict:
    """This rank's copy of the next micro-batch (read here, or received by broadcast from
    the stage's first tensor-parallel rank: ``datasets``)."""
    return next(data_iterator)


def forward_step(data_iterator, model):
    """One micro-batch through ``model`` (a MultimodalModel chunk, wrapped or not):
    ``(output, loss_func)``."""
    if data_iterator is None:
        raise RuntimeError(
            "megatron_mm's forward_step needs a data iterator on every pipeline stage (each "
            "stage reads its own copy of the micro-batch): build the data with "
            "megatron_mm.megatron_lm.train_valid_test_datasets_provider")
    from megatron.training import get_timers

    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    batch = get_batch(data_iterator)
    timers("batch-generator").stop()
    run = run_context()
    output, loss_func = _forward_step(iter((batch,)), model, attention=run.attention)
    cp = run.config.parallel.context_parallel_size
    if cp > 1 and not run.args.calculate_per_token_loss:
        loss_func = partial(_micro_batch_mean, loss_func, batch["loss_mask"].sum(), cp)
    return output, loss_func


def _micro_batch_mean(loss_func, tokens: torch.Tensor, cp: int, output: torch.Tensor):
    """``loss_func``'s sum over this CP rank's tokens scaled so that Megatron-Core's
    per-rank division (by the count returned: 1) and the gradient's mean over the CP
    ranks give the micro-batch's token mean: sum x CP / the micro-batch's ``tokens``."""
    loss, num_tokens, report = loss_func(output)
    scale = cp / tokens.to(loss.device, loss.dtype).clamp(min=1)
    return loss * scale, torch.ones_like(num_tokens), report
