"""Silence megatron-core import warnings that say nothing actionable here.

Without CUDA, Transformer Engine and Apex cannot be installed, so their fallback warnings
(a dozen per process) only bury the training log; with CUDA they stay visible, since there
a missing TE or Apex is worth knowing. The rest are upstream notices about code we do not
use (MIMO, absl logging, CUDA-graph scopes), and GPTModel's deprecation notice, which
points users of this package at a migration that is ours to make.
"""

import logging
import warnings

ALWAYS = (
    r"absl\.logging is not installed",
    r"MimoModelConfig is experimental",
    r"full scope is deprecated",
)
# Megatron-Core's distributed checkpoints: each rank reads its own shards with
# torch.distributed.checkpoint's ``no_dist=True`` (by design, also under torchrun), which
# warns at every load; their tensors are torch's ShardedTensor, deprecated in favour of
# DTensor (Megatron-Core's to move), which warns at every save and load.
CHECKPOINT_WARNINGS = (
    (r"torch\.distributed is disabled, unavailable or uninitialized", UserWarning),
    (r"Please use DTensor instead and we are deprecating ShardedTensor", FutureWarning),
    (r"The argument order of load has been changed", UserWarning),  # its positional call
    # Megatron-Core's gathers (its call to make, not the user's)
    (r"`torch\.distributed\.all_gather_into_tensor` is deprecated", FutureWarning),
)
# Megatron-Core's notices through logging, about choices that are not the user's: the
# async save strategy it uses for every checkpoint (logger, message start).
LOG_NOTICES = (
    ("megatron.core.dist_checkpointing.strategies.torch", "MCore's async save is deprecated"),
)
WITHOUT_CUDA = (
    r"Apex is not installed",
    r"Transformer Engine and Apex are not installed",
    r"'pin_memory' argument is set as true but no accelerator",  # Energon's loader pins
    r"When using async grad allreduce it is recommended to set the environment variable "
    r"CUDA_DEVICE_MAX_CONNECTIONS",  # a CUDA setting
)


def silence_expected_warnings() -> None:
    import torch

    # device_count() asks NVML; is_available() would initialise the CUDA driver here, at
    # import, which breaks every rank a fork server forks after importing this package.
    patterns = ALWAYS + (() if torch.cuda.device_count() > 0 else WITHOUT_CUDA)
    for pattern in patterns:
        warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
    for pattern, category in CHECKPOINT_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)
    logging.getLogger("megatron.core.models.gpt.gpt_model").addFilter(_NotGPTDeprecation())
    for name, start in LOG_NOTICES:
        logging.getLogger(name).addFilter(_Without(start))


class _NotGPTDeprecation(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "GPTModel IS DEPRECATED" not in record.getMessage()


class _Without(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)
