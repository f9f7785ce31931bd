"""What one accelerator and the optimizer cost, as the time and memory models see them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .errors import PlanError
from .record import Record


@dataclass
class Hardware(Record):
    """Time = FLOPs / (peak x efficiency); a stage-boundary transfer = latency + bytes / bandwidth.

    The efficiency factor stands for everything a FLOP count misses (kernel efficiency,
    memory-bound ops, TP communication); it scales all layers alike, so it changes estimated
    seconds but not which partition wins.
    """

    name: str = "H100 SXM, bf16 dense"
    peak_flops: float = 989e12
    efficiency: float = 0.5
    p2p_bandwidth: Optional[float] = None  # bytes/s between neighbouring stages; None: free
    p2p_latency_s: float = 0.0

    def __post_init__(self):
        if self.peak_flops <= 0:
            raise PlanError(f"peak FLOP/s must be positive, got {self.peak_flops}")
        if not 0 < self.efficiency <= 1:
            raise PlanError(f"efficiency must be in (0, 1], got {self.efficiency}")
        if self.p2p_bandwidth is not None and self.p2p_bandwidth <= 0:
            raise PlanError(f"p2p bandwidth must be positive, got {self.p2p_bandwidth}")

    def seconds(self, flops: float) -> float:
        return flops / (self.peak_flops * self.efficiency)

    def transfer_seconds(self, nbytes: float) -> float:
        if self.p2p_bandwidth is None or nbytes <= 0:
            return 0.0
        return self.p2p_latency_s + nbytes / self.p2p_bandwidth


@dataclass
class MemoryModel(Record):
    """Bytes per parameter on the GPU that holds it.

    Trainable: bf16 weight (2) + bf16 grad (2) + fp32 master weight (4) + Adam m and v (8)
    = 16 (Megatron keeps fp32 main grads, 18, unless the grad buffer is bf16; the distributed
    optimizer divides the fp32 part by DP). Frozen: the bf16 weight only, no grad, not in the
    optimizer.
    """

    bytes_per_trainable_param: float = 16.0
    bytes_per_frozen_param: float = 2.0

    def param_bytes(self, params: float, trainable: bool) -> float:
        per = self.bytes_per_trainable_param if trainable else self.bytes_per_frozen_param
        return params * per
