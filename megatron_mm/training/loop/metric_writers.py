"""``--tensorboard-dir`` and ``--wandb-project``: Megatron-LM's metric writers.

As in Megatron-LM both live on the last rank (the one that holds the loss) and take the
same scalar names; TensorBoard also gets each scalar "vs samples", wandb only by
iteration (its steps must not go back). Both packages are optional: asking for one that
is not installed is an error naming the flag and the package, on every rank, before the
model is built.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from ...config import ConfigError


class MetricWriters:
    """Fans ``add_scalar`` out to a TensorBoard SummaryWriter and a wandb run."""

    def __init__(self, tensorboard=None, wandb_run=None):
        self.tensorboard, self.wandb_run = tensorboard, wandb_run

    def add_scalar(self, name: str, value, step: int) -> None:
        if self.tensorboard is not None:
            self.tensorboard.add_scalar(name, value, step)
        if self.wandb_run is not None and not name.endswith(" vs samples"):
            self.wandb_run.log({name: value}, step=step)

    def add_text(self, name: str, text: str, step: int) -> None:
        if self.tensorboard is not None:
            self.tensorboard.add_text(name, text, step)
        if self.wandb_run is not None:
            self.wandb_run.log({name: text}, step=step)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


def _import(module: str, flag: str, package: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise ConfigError(f"{flag} needs the {package} package, which is not installed: "
                          f"pip install {package} (or megatron-mm[logging])") from None


def build_writers(config) -> Optional[MetricWriters]:
    """The writers the flags (``config``: the RunConfig) ask for, on the last rank (None
    elsewhere and without flags). Every rank checks the packages, so a missing one stops
    the job together."""
    log = config.logging
    if not log.tensorboard_dir and not log.wandb_project:
        return None
    summary_writer = wandb = None
    if log.tensorboard_dir:
        _import("tensorboard", "--tensorboard-dir", "tensorboard")
        summary_writer = _import("torch.utils.tensorboard", "--tensorboard-dir",
                                 "tensorboard").SummaryWriter
    if log.wandb_project:
        wandb = _import("wandb", "--wandb-project", "wandb")
    if torch.distributed.get_rank() != torch.distributed.get_world_size() - 1:
        return None
    tensorboard = wandb_run = None
    if summary_writer is not None:
        tensorboard = summary_writer(log_dir=log.tensorboard_dir,
                                     max_queue=log.tensorboard_queue_size)
    if wandb is not None:
        save_dir = log.wandb_save_dir or os.path.join(config.checkpoint.save, "wandb")
        os.makedirs(save_dir, exist_ok=True)
        flags = {k: v for k, v in config.flags().items()
                 if isinstance(v, (int, float, str, bool, type(None), list, tuple))}
        wandb_run = wandb.init(dir=save_dir, name=log.wandb_exp_name,
                               project=log.wandb_project, entity=log.wandb_entity,
                               config=flags)
    return MetricWriters(tensorboard, wandb_run)
