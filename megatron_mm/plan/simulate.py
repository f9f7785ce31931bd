"""Replay a schedule on per-action costs: iteration time, busy and idle time per rank,
bubble fraction, encoder busy time per rank and the share of encoder work hidden in the
LLM's bubbles, and the timeline (Chrome trace, viewable in Perfetto). Each rank runs every
action of its list: with encoder replicas (an encoder TP below the LLM's, whose replicas
share a rank's encoder actions and run them concurrently) the encoder costs are those of
one replica doing all of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .actions import Schedule, replay_order
from .errors import PlanError
from .record import Record


@dataclass
class ActionCosts(Record):
    """Seconds per micro-batch: LLM forward / backward per chunk, encoder per stage, and a
    transfer between ranks (activation or gradient).

    ``llm_start_s`` / ``llm_end_s``: the data-parallel bubbles of the distributed optimizer
    (parameter all-gather before a rank's first LLM action, gradient reduce-scatter after
    its last one). The LLM waits for them; encoder work may run inside them.
    ``grad_sync_s``: gradient synchronisation once every rank is done (Megatron-Core's
    ``finalize_model_grads``: tied-embedding and data-parallel all-reduces); nothing
    overlaps it.
    """

    forward_s: List[float]
    backward_s: List[float]
    encoder_forward_s: List[float] = field(default_factory=list)
    encoder_backward_s: List[float] = field(default_factory=list)
    p2p_s: float = 0.0
    llm_start_s: float = 0.0
    llm_end_s: float = 0.0
    grad_sync_s: float = 0.0

    def of(self, kind: str, chunk: int) -> float:
        table = {"F": self.forward_s, "B": self.backward_s, "EF": self.encoder_forward_s,
                 "EB": self.encoder_backward_s}[kind]
        if chunk >= len(table):
            raise PlanError(f"no {kind} cost for chunk / stage {chunk}")
        return table[chunk]


@dataclass
class TimedAction(Record):
    rank: int
    kind: str
    microbatch: int
    chunk: int
    start_s: float
    end_s: float


@dataclass
class Simulation(Record):
    schedule: str
    iteration_s: float
    busy_s: List[float]
    idle_s: List[float]
    bubble_fraction: float  # idle / (ranks x iteration)
    timeline: List[TimedAction]
    encoder_busy_s: List[float] = field(default_factory=list)  # per rank
    llm_only_iteration_s: Optional[float] = None  # the same LLM orders, encoder work removed
    # 1 - (iteration_s - llm_only_iteration_s) / max(encoder_busy_s), clipped to [0, 1]; None
    # without encoder actions (an encoder inside LLM chunk 0 cannot be told apart)
    encoder_hidden_fraction: Optional[float] = None

    def chrome_trace(self) -> Dict:
        """Chrome trace events: one row per rank, LLM and encoder work in separate
        categories (Perfetto colours them apart)."""
        events = [{"name": f"{t.kind}{t.microbatch}" + (f".{t.chunk}" if t.kind in "FB" else ""),
                   "cat": "encoder" if t.kind.startswith("E") else "llm", "ph": "X",
                   "pid": 0, "tid": t.rank, "ts": t.start_s * 1e6,
                   "dur": (t.end_s - t.start_s) * 1e6} for t in self.timeline]
        events += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": r,
                    "args": {"name": f"rank {r}"}} for r in range(len(self.busy_s))]
        return {"traceEvents": events, "displayTimeUnit": "ms"}


def simulate(schedule: Schedule, costs: ActionCosts, timeline: bool = True) -> Simulation:
    """Each rank runs its actions in order; an action starts when its rank is free and its
    inputs have arrived (plus ``p2p_s`` when they come from another rank); LLM actions also
    wait for ``llm_start_s`` and a rank ends ``llm_end_s`` after its last LLM action.

    The share of encoder work hidden in bubbles (Optimus' "scheduling efficiency", the
    share of encoder computation placed inside LLM bubbles) is measured by what the encoder
    adds to the iteration: ``1 - (T - T_llm) / E``, where T is this schedule's iteration,
    T_llm that of the same per-rank LLM orders with every encoder action removed, and E the
    encoder busy time of the rank with the most encoder work (what the encoder would add
    were none of it hidden); clipped to [0, 1]. ``timeline=False`` skips the per-action
    records (the planner simulates many schedules and needs the numbers only).
    """
    iteration, busy, enc, timeline = _replay(schedule, costs, timeline)
    idle = [iteration - b for b in busy]
    llm_only = hidden = None
    if schedule.encoder_stages and max(enc) > 0:
        llm_only = _replay(_without_encoder(schedule), costs, False)[0]
        hidden = min(1.0, max(0.0, 1.0 - (iteration - llm_only) / max(enc)))
    return Simulation(schedule=schedule.name, iteration_s=iteration, busy_s=busy,
                      idle_s=idle, bubble_fraction=sum(idle) / (iteration * len(busy)),
                      timeline=timeline, encoder_busy_s=enc, llm_only_iteration_s=llm_only,
                      encoder_hidden_fraction=hidden)


def _replay(schedule: Schedule, costs: ActionCosts, record: bool):
    """(iteration, busy per rank, encoder busy per rank, timeline if ``record``)."""
    pp = schedule.pipeline_model_parallel_size
    finish: Dict = {}
    owner: Dict = {}
    clock = [0.0] * pp
    llm_end = [0.0] * pp
    busy = [0.0] * pp
    enc = [0.0] * pp
    timeline = []
    p2p, start = costs.p2p_s, costs.llm_start_s
    for rank, a in replay_order(schedule):
        llm = a.kind in ("F", "B")
        ready = max(clock[rank], start) if llm else clock[rank]
        for dep in schedule.dependencies(a):
            arrival = finish[dep] + (p2p if owner[dep] != rank else 0.0)
            if arrival > ready:
                ready = arrival
        duration = costs.of(a.kind, a.chunk)
        end = ready + duration
        finish[a.key], owner[a.key] = end, rank
        clock[rank] = end
        busy[rank] += duration
        if llm:
            llm_end[rank] = end
        else:
            enc[rank] += duration
        if record:
            timeline.append(TimedAction(rank, a.kind, a.microbatch, a.chunk, ready, end))
    iteration = max(max(c, e + costs.llm_end_s) for c, e in zip(clock, llm_end))
    return iteration + costs.grad_sync_s, busy, enc, timeline


def _without_encoder(schedule: Schedule) -> Schedule:
    """The same LLM orders on every rank, the encoder's actions left out."""
    return Schedule(name=schedule.name + " (LLM only)",
                    pipeline_model_parallel_size=schedule.pipeline_model_parallel_size,
                    virtual_pipeline_model_parallel_size=(
                        schedule.virtual_pipeline_model_parallel_size),
                    num_microbatches=schedule.num_microbatches,
                    ranks=[[a for a in r if a.kind in ("F", "B")] for r in schedule.ranks])
