"""Which activations are recomputed in the backward pass."""

from dataclasses import dataclass, replace
from typing import List, Literal, Optional

from ....config import ConfigError
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

    def errors(self) -> List[ConfigError]:
        """This group's own checks, each naming its flag."""
        gran, method, n = (self.recompute_granularity, self.recompute_method,
                           self.recompute_num_layers)
        if self.recompute_memory_budget is not None:
            if self.recompute_memory_budget <= 0:
                return [ConfigError("--recompute-memory-budget must be positive (GB per rank)")]
            if gran not in (None, "full") or method not in (None, "block") or n is not None:
                return [ConfigError("--recompute-memory-budget chooses --recompute-num-layers "
                                    "per stage for --recompute-granularity full "
                                    "--recompute-method block: drop the other --recompute-* "
                                    "flags")]
            return []
        if gran == "selective" and (method is not None or n is not None):
            return [ConfigError("--recompute-granularity selective takes no --recompute-method "
                                "or --recompute-num-layers")]
        if gran == "full" and (method is None or n is None):
            return [ConfigError("--recompute-granularity full needs --recompute-method "
                                "(uniform or block) and --recompute-num-layers")]
        if gran is None and (method is not None or n is not None):
            return [ConfigError("--recompute-method and --recompute-num-layers need "
                                "--recompute-granularity full")]
        if n is not None and n < 1:
            return [ConfigError("--recompute-num-layers must be >= 1")]
        return []

    def derived(self) -> "RecomputeArgs":
        """``--recompute-memory-budget`` recomputes full blocks (the number per stage is the
        plan's)."""
        if self.recompute_memory_budget is None:
            return self
        return replace(self, recompute_granularity="full", recompute_method="block")
