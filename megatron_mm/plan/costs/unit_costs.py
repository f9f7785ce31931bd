"""The one time model of the planner's estimates: compute seconds on ``Hardware``, the
tensor-parallel traffic and the pipeline's point-to-point sends on ``Interconnect`` links.

The partition's estimate (``pipeline.estimate``: its chunk seconds and stage-boundary
sends) and every per-action cost table (``simulate.ActionCosts``) are timed here:

- the cluster-scale Optimus planner (``action_costs.CostModel``: units from model sizes, a
  transformer layer or its attention / MLP kernel);
- the training run (``encoder_pipeline.schedule_costs`` / ``megatron_costs``: units are the
  training chain's layers, FLOPs of the cost model or the seconds of a measured
  ``--pipeline-profile``), which ``--encoder-schedule auto`` simulates, the ``bubble``
  schedule is generated on and the simulator replays.

So the planner, the runtime's schedule and the simulator charge the same seconds for the
same work. A unit at TP t: its FLOPs / t on the hardware, plus ``allreduces`` ring
all-reduces of its output activation per forward (Megatron without communication
overlap: 2 per transformer layer, one after attention, one after the MLP), as many per
backward and as many again for the recompute forward, where a backward runs. Encoder
replicas (an encoder TP e below the LLM's t: r = t / e replicas per TP group) take turns
with the micro-batches, so one rank's lane carries 1 / r of each encoder action
(``replica_share``), broadcasts an encoder's output over the t ranks (``BCAST``) and sums
its encoder gradients over the r replicas once per iteration (``ALLREDUCE``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

from ..errors import PlanError
from ..record import Record
from .flops import FP32
from .hardware import Hardware, Interconnect


@dataclass
class UnitSeconds(Record):
    """One unit's forward and backward seconds, and the part of each that is its TP
    all-reduces (compute idle: Optimus' TP bubbles)."""

    forward_s: float
    backward_s: float
    forward_comm_s: float = 0.0
    backward_comm_s: float = 0.0


def backward_allreduces(forward_allreduces: int, recompute: bool) -> int:
    """A backward's all-reduces: as many as its forward's, twice with the recompute
    forward inside it."""
    return (2 if recompute else 1) * forward_allreduces


def replica_share(tensor_model_parallel_size: int,
                  encoder_tensor_model_parallel_size: Optional[int]) -> float:
    """The part of each encoder action one rank's lane carries: 1 / (TP / encoder TP)."""
    tp, etp = tensor_model_parallel_size, encoder_tensor_model_parallel_size or \
        tensor_model_parallel_size
    if etp < 1 or tp % etp:
        raise PlanError(f"--encoder-tensor-model-parallel-size ({etp}) must divide "
                        f"--tensor-model-parallel-size ({tp})")
    return etp / tp if etp < tp else 1.0


@dataclass
class TimeModel(Record):
    """Seconds of compute (``hardware``) and of TP traffic (``links``; None: free)."""

    hardware: Hardware = field(default_factory=Hardware)
    links: Optional[Interconnect] = None

    def compute_s(self, flops: float, ways: int = 1) -> float:
        return self.hardware.seconds(flops / ways)

    def allreduce_s(self, nbytes: float, ways: int) -> float:
        return 0.0 if self.links is None else self.links.allreduce_seconds(nbytes, ways)

    def p2p_s(self, nbytes: float) -> float:
        """One send of ``nbytes`` to the next (or previous) pipeline rank."""
        return 0.0 if self.links is None else self.links.p2p_seconds(nbytes)

    def fan_out_s(self, nbytes: float, copies: int) -> float:
        """One rank sending ``nbytes`` to each of ``copies`` ranks (the separate
        placement's encoder messages, ``separate.Members``): the copies leave on the
        sender's one link, so their bytes add; they go out together, one latency."""
        return self.p2p_s(nbytes * copies)

    def chunk_s(self, layers) -> Tuple[float, float]:
        """(forward, backward) seconds of one micro-batch through consecutive chain
        ``layers`` (``pipeline.layers.Layer``: costs per rank, backward with recompute),
        their expert all-to-alls included."""
        a2a_f, a2a_b = self.expert_all_to_all_s(layers)
        return (self.compute_s(sum(l.fwd_flops for l in layers)) + a2a_f,
                self.compute_s(sum(l.bwd_flops for l in layers)) + a2a_b)

    def expert_all_to_all_s(self, layers) -> Tuple[float, float]:
        """(forward, backward) seconds of the expert all-to-alls of chain ``layers``: 2 per
        MoE layer's forward (dispatch, combine), as many per backward, and again for the
        recompute forward (free without links)."""
        if self.links is None:
            return 0.0, 0.0
        fwd = bwd = 0.0
        for l in layers:
            one = self.links.all_to_all_seconds(l.a2a_bytes, l.a2a_span)
            fwd += 2 * one
            if l.runs_backward:
                bwd += backward_allreduces(2, l.recompute) * one
        return fwd, bwd

    def broadcast_s(self, nbytes: float, ways: int) -> float:
        return 0.0 if self.links is None else self.links.broadcast_seconds(nbytes, ways)

    def unit(self, fwd_flops: float, bwd_flops: float, tp: int = 1, act_bytes: float = 0.0,
             allreduces: int = 0, recompute: bool = False, backward: bool = True
             ) -> UnitSeconds:
        """A unit of ``fwd_flops`` / ``bwd_flops`` (whole-unit FLOPs, recompute included in
        the backward's) at ``tp``, with ``allreduces`` all-reduces of ``act_bytes`` per
        forward; ``backward``: whether one runs (a frozen unit: forward only)."""
        ar = self.allreduce_s(act_bytes, tp) if allreduces else 0.0
        f_comm = allreduces * ar
        if not backward:
            return UnitSeconds(self.compute_s(fwd_flops, tp) + f_comm, 0.0, f_comm, 0.0)
        b_comm = backward_allreduces(allreduces, recompute) * ar
        return UnitSeconds(self.compute_s(fwd_flops, tp) + f_comm,
                           self.compute_s(bwd_flops, tp) + b_comm, f_comm, b_comm)

    def replica_allreduce_s(self, params: float, replicas: int) -> float:
        """The encoder replicas' fp32 gradient sum of ``params`` (per GPU)."""
        return self.allreduce_s(FP32 * params, replicas)
