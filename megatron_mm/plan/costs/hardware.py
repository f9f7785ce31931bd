"""What one accelerator and the optimizer cost, as the time and memory models see them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import PlanError
from ..record import Record


@dataclass
class Hardware(Record):
    """Time = FLOPs / (peak x efficiency); ``p2p_bandwidth`` / ``p2p_latency_s`` describe the
    link between neighbouring stages (``p2p_links``, timed as ``Interconnect.p2p_seconds``).

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

    def p2p_links(self) -> Optional[Interconnect]:
        """The stage-boundary link for the time model; None (free) without a bandwidth."""
        if self.p2p_bandwidth is None:
            return None
        return Interconnect(name=f"{self.name}: stage-boundary link",
                            p2p_bandwidth=self.p2p_bandwidth, p2p_latency_s=self.p2p_latency_s)


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
    # A routed expert's (None: as any other): the distributed optimizer divides its fp32
    # part by the expert data-parallel size, world / (PP x EP x expert TP), not by DP.
    bytes_per_trainable_expert_param: Optional[float] = None

    def param_bytes(self, params: float, trainable: bool) -> float:
        per = self.bytes_per_trainable_param if trainable else self.bytes_per_frozen_param
        return params * per

    def layer_param_bytes(self, params: float, expert_params: float, trainable: bool) -> float:
        """A layer's ``params``, of which ``expert_params`` are routed experts'."""
        expert = self.bytes_per_trainable_expert_param
        if not trainable or expert is None:
            return self.param_bytes(params, trainable)
        return self.param_bytes(params - expert_params, True) + expert_params * expert


@dataclass
class Interconnect(Record):
    """Link speeds the schedule simulator charges (bytes/s of bus bandwidth per GPU).

    ``tp_bandwidth``: a ring all-reduce of n bytes over t GPUs takes 2 (t - 1) / t x n / bw
    (NVLink inside a node); ``dp_bandwidth``: all-gather and reduce-scatter of the
    distributed optimizer, (d - 1) / d x n / bw each (RDMA between nodes);
    ``p2p_bandwidth``: a pipeline send of one activation or gradient. ``tp_latency_s``:
    what each all-reduce or broadcast inside the node costs besides its bytes (0: the
    bandwidth term alone, as the cluster-scale tables charge).
    """

    name: str = "H100 node: NVLink 4 + 400 Gb/s RDMA per GPU"
    tp_bandwidth: float = 360e9
    dp_bandwidth: float = 40e9
    p2p_bandwidth: float = 40e9
    p2p_latency_s: float = 20e-6
    tp_latency_s: float = 0.0
    gpus_per_node: int = 8  # a group within a node talks over tp_bandwidth

    def __post_init__(self):
        for name in ("tp_bandwidth", "dp_bandwidth", "p2p_bandwidth"):
            if getattr(self, name) <= 0:
                raise PlanError(f"{name} must be positive, got {getattr(self, name)}")
        if self.tp_latency_s < 0 or self.p2p_latency_s < 0:
            raise PlanError("link latencies must not be negative")

    def allreduce_seconds(self, nbytes: float, ways: int) -> float:
        return 0.0 if ways <= 1 else (self.tp_latency_s + 2.0 * (ways - 1) / ways * nbytes
                                      / self.tp_bandwidth)

    def broadcast_seconds(self, nbytes: float, ways: int) -> float:
        """A pipelined ring broadcast of n bytes to ``ways`` GPUs of a node (the encoder
        replicas' output to the LLM TP group): (t - 1) / t x n / bw."""
        return 0.0 if ways <= 1 else (self.tp_latency_s + (ways - 1) / ways * nbytes
                                      / self.tp_bandwidth)

    def all_to_all_seconds(self, nbytes: float, span: int) -> float:
        """An expert all-to-all sending ``nbytes`` off each GPU of an expert-parallel group
        spanning ``span`` GPUs: over NVLink within a node, else over the RDMA links."""
        if nbytes <= 0:
            return 0.0
        if span <= self.gpus_per_node:
            return self.tp_latency_s + nbytes / self.tp_bandwidth
        return self.p2p_latency_s + nbytes / self.dp_bandwidth

    def dp_seconds(self, nbytes: float, ways: int) -> float:
        """One all-gather or reduce-scatter over ``ways`` data-parallel replicas."""
        return 0.0 if ways <= 1 else (ways - 1) / ways * nbytes / self.dp_bandwidth

    def p2p_seconds(self, nbytes: float) -> float:
        """The one p2p cost: a send of ``nbytes`` between pipeline ranks, latency + bytes /
        bandwidth; nothing sent (a frozen stage's absent gradient) costs nothing."""
        return 0.0 if nbytes <= 0 else self.p2p_latency_s + nbytes / self.p2p_bandwidth


H100 = Hardware(name="H100 SXM, bf16 dense", peak_flops=989e12, efficiency=0.5)
A100 = Hardware(name="A100 80GB SXM, bf16 dense", peak_flops=312e12, efficiency=0.5)
H100_LINKS = Interconnect()
A100_LINKS = Interconnect(name="A100 node: NVLink 3 + 200 Gb/s RDMA per GPU",
                          tp_bandwidth=230e9, dp_bandwidth=20e9, p2p_bandwidth=20e9)
