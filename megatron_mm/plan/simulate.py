"""Replay a schedule on per-action costs: iteration time, busy and idle time per rank,
bubble fraction, and the timeline (Chrome trace, viewable in Perfetto)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

from .actions import Schedule, replay_order
from .errors import PlanError
from .record import Record


@dataclass
class ActionCosts(Record):
    """Seconds per micro-batch: LLM forward / backward per chunk, encoder per stage, and a
    transfer between ranks (activation or gradient)."""

    forward_s: List[float]
    backward_s: List[float]
    encoder_forward_s: List[float] = field(default_factory=list)
    encoder_backward_s: List[float] = field(default_factory=list)
    p2p_s: float = 0.0

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


def simulate(schedule: Schedule, costs: ActionCosts) -> Simulation:
    """Each rank runs its actions in order; an action starts when its rank is free and its
    inputs have arrived (plus ``p2p_s`` when they come from another rank)."""
    finish: Dict = {}
    owner: Dict = {}
    clock = [0.0] * schedule.pipeline_model_parallel_size
    busy = [0.0] * schedule.pipeline_model_parallel_size
    timeline = []
    for rank, a in replay_order(schedule):
        ready = clock[rank]
        for dep in schedule.dependencies(a):
            arrival = finish[dep] + (costs.p2p_s if owner[dep] != rank else 0.0)
            ready = max(ready, arrival)
        duration = costs.of(a.kind, a.chunk)
        finish[a.key], owner[a.key] = ready + duration, rank
        clock[rank] = ready + duration
        busy[rank] += duration
        timeline.append(TimedAction(rank, a.kind, a.microbatch, a.chunk, ready,
                                    ready + duration))
    iteration = max(clock)
    idle = [iteration - b for b in busy]
    return Simulation(schedule=schedule.name, iteration_s=iteration, busy_s=busy,
                      idle_s=idle, bubble_fraction=sum(idle) / (iteration * len(busy)),
                      timeline=timeline)
