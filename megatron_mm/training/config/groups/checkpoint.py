"""Where checkpoints are saved and loaded from, and what they hold."""

from dataclasses import dataclass
from typing import List, Optional

from ....config import ConfigError


@dataclass(frozen=True)
class CheckpointArgs:
    """Where checkpoints are saved and loaded from, and what they hold."""

    save: Optional[str] = None
    load: Optional[str] = None
    save_interval: Optional[int] = None
    no_load_optim: bool = False
    no_load_rng: bool = False
    no_save_optim: bool = False
    no_save_rng: bool = False
    dist_ckpt_optim_fully_reshardable: bool = False
    """save the distributed optimizer's state reshardable across TP/PP (gathered over the
    data-parallel ranks at each save); default dp_reshardable: it loads at another data-parallel
    size only"""
    distrib_optim_fully_reshardable_mem_efficient: bool = False
    """with --dist-ckpt-optim-fully-reshardable: gather over gloo to the first data-parallel rank
    only (less host and device memory, a serial save)"""
    ckpt_step: Optional[int] = None
    """load iteration N of --load instead of the one its latest_checkpointed_iteration.txt names
    (Megatron-LM's; 0: that one): the way back from a damaged checkpoint"""
    finetune: bool = False
    """load model weights only and start at iteration 0"""
    exit_on_missing_checkpoint: bool = False
    """kept for Megatron compatibility: a --load without a checkpoint is always an error unless
    --load equals --save (auto-resume)"""

    def errors(self) -> List[ConfigError]:
        """This group's own checks, each naming its flag."""
        out = []
        if self.save_interval is not None and self.save is None:
            out.append(ConfigError("--save-interval needs --save DIR"))
        if self.ckpt_step is not None and self.ckpt_step < 0:
            out.append(ConfigError("--ckpt-step must not be negative"))
        if self.ckpt_step and self.load is None:
            out.append(ConfigError("--ckpt-step needs --load DIR"))
        return out
