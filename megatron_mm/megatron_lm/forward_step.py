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
"""

from __future__ import annotations

from ..training.step import forward_step as _forward_step
from .context import run_context


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
    try:
        return _forward_step(data_iterator, model, attention=run_context().attention)
    finally:
        timers("batch-generator").stop()
