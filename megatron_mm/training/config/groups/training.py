"""The batch, the iterations, the optimizer and its learning-rate schedule."""

from dataclasses import dataclass, field
from typing import List, Literal, Optional

from ....config import ConfigError

from .fields import DERIVED


@dataclass(frozen=True)
class TrainingArgs:
    """The batch, the iterations, the optimizer and its learning-rate schedule."""

    micro_batch_size: int = 8
    global_batch_size: Optional[int] = None
    train_iters: int = 100
    lr: float = 0.001
    min_lr: float = 0.0
    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = "cosine"
    lr_decay_iters: Optional[int] = None
    lr_warmup_iters: int = 0
    lr_warmup_init: float = 0.0
    weight_decay: float = 0.01
    vision_lr: Optional[float] = None
    """peak learning rate of the vision encoder (default: --lr)"""
    vision_min_lr: Optional[float] = None
    """minimum learning rate of the vision encoder (default: --min-lr)"""
    vision_weight_decay: Optional[float] = None
    """weight decay of the vision encoder (default: --weight-decay)"""
    audio_lr: Optional[float] = None
    """peak learning rate of the audio encoder (default: --lr)"""
    audio_min_lr: Optional[float] = None
    """minimum learning rate of the audio encoder (default: --min-lr)"""
    audio_weight_decay: Optional[float] = None
    """weight decay of the audio encoder (default: --weight-decay)"""
    projector_lr: Optional[float] = None
    """peak learning rate of the projectors (default: --lr)"""
    projector_min_lr: Optional[float] = None
    """minimum learning rate of the projectors (default: --min-lr)"""
    projector_weight_decay: Optional[float] = None
    """weight decay of the projectors (default: --weight-decay)"""
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-08
    clip_grad: float = 1.0
    seed: int = 1234
    bf16: bool = False
    num_microbatches: Optional[int] = field(default=None, metadata=DERIVED)
    """Derived by validation (not a flag)."""

    @property
    def decay_iters(self) -> int:
        """``--lr-decay-iters``, by default ``--train-iters`` (at least 1)."""
        return self.lr_decay_iters if self.lr_decay_iters is not None else max(self.train_iters, 1)

    def errors(self) -> List[ConfigError]:
        """This group's own checks, each naming its flag (the module rates':
        ``module_lr_args``, which needs the model)."""
        out = []
        if self.lr_warmup_iters >= self.decay_iters:  # Megatron-Core's scheduler asserts <
            out.append(ConfigError(f"--lr-warmup-iters ({self.lr_warmup_iters}) must be below "
                                   f"--lr-decay-iters ({self.decay_iters}, default "
                                   "--train-iters)"))
        if self.lr_warmup_init > self.lr:
            out.append(ConfigError(f"--lr-warmup-init ({self.lr_warmup_init}) exceeds --lr "
                                   f"({self.lr})"))
        if self.min_lr > self.lr:
            out.append(ConfigError(f"--min-lr ({self.min_lr}) exceeds --lr ({self.lr})"))
        if self.train_iters < 0:  # 0 with --save writes the initial checkpoint
            out.append(ConfigError("--train-iters must not be negative"))
        return out
