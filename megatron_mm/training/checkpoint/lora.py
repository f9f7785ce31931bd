"""A LoRA run loading a checkpoint without adapters (the imported base model, or a
full fine-tune): its weights load, the adapters keep their initial values (B zero: the
model starts as the base)."""

from __future__ import annotations

from megatron.core import dist_checkpointing

from ...models.lora import SUFFIX, keep_fresh_adapters
from .errors import CheckpointError


def holds_adapters(path: str) -> bool:
    return any(f"{SUFFIX}." in key for key in dist_checkpointing.load_tensors_metadata(path))


def adapters_from(path: str, chunks, with_optim: bool, log=print) -> None:
    """Before loading ``path`` into ``chunks``: without adapters there, theirs start fresh
    (and the optimizer state, of other parameters, cannot load)."""
    if not keep_fresh_adapters(chunks, False) or holds_adapters(path):
        return
    if with_optim:
        raise CheckpointError(f"{path} holds no LoRA adapters but optimizer state of other "
                              f"parameters: pass --finetune (or --no-load-optim) to start "
                              f"the adapters from it")
    keep_fresh_adapters(chunks, True)
    log(f" > {path} holds no LoRA adapters: loading its weights, the adapters start fresh")
