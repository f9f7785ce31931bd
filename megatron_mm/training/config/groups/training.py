"""The batch, the iterations, the optimizer and its learning-rate schedule."""

from dataclasses import dataclass, field
from typing import Literal, Optional

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
