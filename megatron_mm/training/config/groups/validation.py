"""Validation during and after training."""

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class ValidationArgs:
    """Validation during and after training."""

    eval_interval: Optional[int] = None
    eval_iters: int = 10
    eval_max_new_tokens: int = 8
    """greedy-decoding budget for the answer accuracy (0: no answer accuracy, the validation loss
    only)"""
    skip_final_eval: bool = False
