"""Megatron-LM's ``pretrain`` for multimodal models, on Megatron-Core: the entry the
scripts call. The run's state and loop are the ``Trainer``'s (``trainer.py``)."""

from __future__ import annotations

from typing import Optional

from .config.run_config import RunConfig
from .loop.trainer import Trainer, TrainingCallbacks


def setup_training(config: RunConfig) -> Trainer:
    """Process groups, tokenizer, plan, data, model chunks, optimizer and scheduler: the
    ``Trainer`` (``tokenizer``, ``train_ds``, ``model``, ``model_chunks``, ``optimizer``,
    ``scheduler``, ``plan``, ``executor`` ...)."""
    return Trainer.build(config)


def pretrain(config: RunConfig, callbacks: Optional[TrainingCallbacks] = None) -> dict:
    """Train as the flags say; returns a summary (losses per iteration, last evaluation)."""
    return setup_training(config).train(callbacks)
