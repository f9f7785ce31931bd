"""Validation during and after training."""

from dataclasses import dataclass
from typing import List, Optional

from ....config import ConfigError
from .fields import not_positive


@dataclass(frozen=True)
class ValidationArgs:
    """Validation during and after training."""

    eval_interval: Optional[int] = None
    eval_iters: int = 10
    eval_max_new_tokens: int = 8
    """greedy-decoding budget for the answer accuracy (0: no answer accuracy, the validation loss
    only)"""
    skip_final_eval: bool = False

    def errors(self) -> List[ConfigError]:
        """This group's own checks, each naming its flag."""
        out = not_positive(self, "eval_interval")  # None: every --train-iters
        if self.eval_iters < 0:  # 0: no validation, as in Megatron-LM
            out.append(ConfigError("--eval-iters must not be negative (0 disables validation)"))
        if self.eval_max_new_tokens < 0:  # 0: no answer accuracy
            out.append(ConfigError("--eval-max-new-tokens must not be negative (0: no answer "
                                   "accuracy)"))
        return out
