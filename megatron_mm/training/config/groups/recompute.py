"""Which activations are recomputed in the backward pass."""

from dataclasses import dataclass
from typing import Literal, Optional
from .fields import flag


@dataclass(frozen=True)
class RecomputeArgs:
    """Which activations are recomputed in the backward pass."""

    recompute_granularity: Optional[Literal["full", "selective"]] = None
    """full: recompute whole transformer layers (--recompute-method, --recompute-num-layers);
    selective: only core attention"""
    recompute_method: Optional[Literal["uniform", "block"]] = None
    """uniform: layers in groups of --recompute-num-layers; block: the first --recompute-num-layers
    layers of each stack in each chunk"""
    recompute_num_layers: Optional[int] = None
    recompute_memory_budget: Optional[float] = flag(None, metavar="GB")
    """adaptive recompute (OmniBal): per pipeline stage, recompute the fewest leading layers (block
    method) that keep model state plus in-flight activations within this many GB per rank;
    activation bytes from --pipeline-profile when it has them, else the model"""
