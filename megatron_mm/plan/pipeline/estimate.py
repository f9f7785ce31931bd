"""Iteration-time and memory estimate of a partition.

Per rank r, R_r = sum over its chunks of (forward + backward) time of one micro-batch,
backward including recompute. With M micro-batches:

    T = M * max_r R_r  +  (sum_r R_r - max_r R_r) / VPP  +  sum_b comm_b / VPP

The first term is the bottleneck rank working through every micro-batch; the second is the
warm-up and cool-down that the other ranks' work adds on the critical path, which
interleaving shrinks by VPP (Narayanan et al., 2021). For equal stages of time t this is
(M + PP - 1) t for 1F1B and M t + (PP - 1) t / VPP interleaved, the textbook bubbles; with
VPP = 1 it is "sum of stage times + (M - 1) x max stage time" (DESIGN A). comm_b is the
forward activation plus backward gradient transfer at chunk boundary b (zero unless
``Hardware.p2p_bandwidth`` is set); steady-state transfers are taken as overlapped. Chunk
seconds and transfers are those of the one time model (``costs.unit_costs.TimeModel``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

from ..costs.hardware import Hardware, MemoryModel
from ..costs.unit_costs import TimeModel
from ..record import Record
from .layers import LLM, Layer
from .memory import stage_memory
from .partition import StagePartition


@dataclass
class PipelineEstimate(Record):
    schedule: str  # 1f1b | interleaved-1f1b
    pipeline_model_parallel_size: int
    virtual_pipeline_model_parallel_size: int
    num_microbatches: int
    chunk_forward_s: List[float]  # per micro-batch, chunk order
    chunk_backward_s: List[float]
    stage_forward_s: List[float]  # per pipeline rank (sum of its chunks)
    stage_backward_s: List[float]
    boundary_comm_s: List[float]  # per chunk boundary, forward + backward transfer
    iteration_s: float
    bubble_s: float  # iteration_s minus the bottleneck rank's own work
    stage_param_bytes: List[float]  # weights + grads + optimizer state per rank
    stage_activation_bytes: List[float]  # in-flight activations per rank
    inflight_microbatches: List[List[int]]  # per rank, per local chunk

    @property
    def stage_time_s(self) -> List[float]:
        return [f + b for f, b in zip(self.stage_forward_s, self.stage_backward_s)]

    @property
    def stage_memory_bytes(self) -> List[float]:
        return [p + a for p, a in zip(self.stage_param_bytes, self.stage_activation_bytes)]

    @property
    def bottleneck_stage(self) -> int:
        times = self.stage_time_s
        return times.index(max(times))


def estimate(chain: Sequence[Layer], part: StagePartition, num_microbatches: int,
             hardware: Optional[Hardware] = None,
             memory: Optional[MemoryModel] = None) -> PipelineEstimate:
    hardware, memory = hardware or Hardware(), memory or MemoryModel()
    pp, vpp = part.pipeline_model_parallel_size, part.virtual_pipeline_model_parallel_size
    if part.num_layers != len(chain):
        raise ValueError(f"partition covers {part.num_layers} layers, chain has {len(chain)}")
    if num_microbatches < 1:
        raise ValueError("num_microbatches must be >= 1")
    bounds = part.chunk_bounds()
    time = TimeModel(hardware, hardware.p2p_links())
    fwd, bwd = (list(t) for t in zip(*(time.chunk_s(chain[s:e]) for s, e in bounds)))
    comm = [time.p2p_s(f) + time.p2p_s(b)
            for f, b in (_boundary_bytes(chain, e) for _, e in bounds[:-1])]
    stage_f, stage_b = [0.0] * pp, [0.0] * pp
    for c in range(part.num_chunks):
        stage_f[c % pp] += fwd[c]
        stage_b[c % pp] += bwd[c]
    per_rank = [f + b for f, b in zip(stage_f, stage_b)]
    slowest = max(per_rank)
    iteration = (num_microbatches * slowest + (sum(per_rank) - slowest) / vpp
                 + sum(comm) / vpp)
    params, acts, inflight = stage_memory(chain, bounds, pp, vpp, num_microbatches, memory)
    return PipelineEstimate(
        schedule="1f1b" if vpp == 1 else "interleaved-1f1b",
        pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp,
        num_microbatches=num_microbatches, chunk_forward_s=fwd, chunk_backward_s=bwd,
        stage_forward_s=stage_f, stage_backward_s=stage_b, boundary_comm_s=comm,
        iteration_s=iteration, bubble_s=iteration - num_microbatches * slowest,
        stage_param_bytes=params, stage_activation_bytes=acts, inflight_microbatches=inflight)


def _boundary_bytes(chain: Sequence[Layer], end: int):
    """(forward, backward) bytes crossing a cut before layer ``end``. Before the LLM's decoder
    layers two tensors travel: the text embeddings (with the features of the projectors
    passed so far merged in) and, inside an encoder, its hidden state. A gradient comes back
    only for tensors whose producers run a backward."""
    last = chain[end - 1]
    sent = last.out_bytes + last.deepstack_bytes  # with the DeepStack features it carries
    if last.branch == LLM and last.kind != "llm_embed":
        return sent, sent if last.runs_backward else 0.0
    text = chain[0]
    merged = [l for l in chain[:end] if l.kind == "projector"] + [text]
    forward = text.out_bytes + sum(l.deepstack_bytes for l in merged)
    backward = forward if any(l.runs_backward for l in merged) else 0.0
    if last.kind != "projector" and last is not text:  # inside an encoder
        forward += sent
        backward += sent if last.runs_backward else 0.0
    return forward, backward
