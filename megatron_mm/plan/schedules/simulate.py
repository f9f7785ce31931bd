"""Replay a schedule on per-action costs: iteration time, busy and idle time per rank,
bubble fraction, encoder busy time per rank and the share of encoder work hidden in the
LLM's bubbles, and the timeline (Chrome trace, viewable in Perfetto). Each rank runs every
action of its list: with encoder replicas (an encoder TP below the LLM's, whose replicas
share a rank's encoder actions and run them concurrently) the encoder costs are those of
one replica doing all of them.

Collectives are charged as the runtime runs them: ``BCAST`` and ``ALLREDUCE`` block the
rank (synchronous collectives between compute), ``GRAD_SYNC`` / ``ENCODER_GRAD_SYNC``
start a data-parallel reduction on the rank's communication stream, which runs beside its
compute, one reduction after the other; the rank is done when both streams are. The expert
all-to-alls (``A2A`` / ``A2A_B``) block the rank right after their LLM action, whose outputs
leave only once they are done (they run inside it)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from ..errors import PlanError
from ..record import Record
from .actions import Action, Kind, Schedule, replay_order


@dataclass
class ActionCosts(Record):
    """Seconds per micro-batch: LLM forward / backward per chunk, encoder per stage, and a
    transfer between ranks (activation or gradient; ``p2p_s``: the time model's
    ``TimeModel.p2p_s`` of the message, a measured send, or 0: free).

    ``llm_start_s`` / ``llm_end_s``: the data-parallel bubbles of the distributed optimizer
    (parameter all-gather before a rank's first LLM action, gradient reduce-scatter after
    its last one). The LLM waits for them; encoder work may run inside them.
    ``grad_sync_s``: gradient synchronisation once every rank is done (Megatron-Core's
    ``finalize_model_grads``: tied-embedding and data-parallel all-reduces); nothing
    overlaps it. ``optimizer_s``: the optimizer step after it (the iteration's tail).

    ``forward_comm_s`` / ``backward_comm_s`` per LLM chunk: the part of its forward /
    backward spent waiting for its tensor-parallel all-reduces (compute idle: encoder
    actions ``in_tp_bubble`` run there); ``encoder_forward_comm_s`` /
    ``encoder_backward_comm_s`` per encoder piece: the part of ``EF`` / ``EB`` that is its
    own TP all-reduces: inside a TP bubble they slow the LLM's all-reduces on the same
    links, so the rank pays for them once more; empty: none.

    The collectives' seconds (an empty list: the costs do not model that traffic, it is
    free): ``broadcast_s`` per encoder piece (``BCAST`` of an encoder's last piece's
    output over the LLM TP group), ``replica_allreduce_s`` per pipeline rank
    (``ALLREDUCE`` of its encoder pieces' gradients over the replicas), ``reduce_s`` per
    LLM chunk (the data-parallel gradient reduction ``GRAD_SYNC`` starts),
    ``encoder_reduce_s`` per encoder piece (its gradients' reduction: its own
    ``ENCODER_GRAD_SYNC``, or part of its rank's first chunk's ``GRAD_SYNC``). Costs with
    ``reduce_s`` charge the reduction there, not in ``llm_end_s``: they need a schedule
    with ``GRAD_SYNC`` actions. ``all_to_all_s`` / ``backward_all_to_all_s`` per LLM chunk:
    its MoE layers' expert all-to-alls in one forward (``A2A``: dispatch and combine) /
    backward (``A2A_B``: as many, of the gradients, and the recompute forward's), not part
    of ``forward_s`` / ``backward_s``.
    """

    forward_s: List[float]
    backward_s: List[float]
    encoder_forward_s: List[float] = field(default_factory=list)
    encoder_backward_s: List[float] = field(default_factory=list)
    p2p_s: float = 0.0
    llm_start_s: float = 0.0
    llm_end_s: float = 0.0
    grad_sync_s: float = 0.0
    optimizer_s: float = 0.0
    forward_comm_s: List[float] = field(default_factory=list)
    backward_comm_s: List[float] = field(default_factory=list)
    encoder_forward_comm_s: List[float] = field(default_factory=list)
    encoder_backward_comm_s: List[float] = field(default_factory=list)
    broadcast_s: List[float] = field(default_factory=list)
    replica_allreduce_s: List[float] = field(default_factory=list)
    reduce_s: List[float] = field(default_factory=list)
    encoder_reduce_s: List[float] = field(default_factory=list)
    # DeepStack (Qwen3-VL): the seconds the features add to a message between ranks, per
    # LLM chunk (its output and that output's gradient) and per encoder piece (likewise);
    # empty: none
    deepstack_p2p_s: List[float] = field(default_factory=list)
    encoder_deepstack_p2p_s: List[float] = field(default_factory=list)
    # the separate placement (one piece per encoder), per encoder, in place of ``p2p_s``
    # and the DeepStack term: the seconds of its output's message to the LLM (``EF`` to
    # ``F(g, 0)``, its DeepStack features included, every copy the sender fans out) and of
    # the gradient's back (``B(g, 0)`` to ``EB``; empty: the output's); empty: none
    encoder_output_p2p_s: List[float] = field(default_factory=list)
    encoder_grad_p2p_s: List[float] = field(default_factory=list)
    all_to_all_s: List[float] = field(default_factory=list)
    backward_all_to_all_s: List[float] = field(default_factory=list)
    # Micro-batches of different work (real samples: tiles and tokens vary): micro-batch
    # m's compute costs are microbatches[m]'s tables; empty: every one costs the above.
    microbatches: List[ActionCosts] = field(default_factory=list)

    def transfer_s(self, dep: Tuple[str, int, int], consumer: Action) -> float:
        """Seconds of the message from action ``dep`` to ``consumer`` on another rank:
        ``p2p_s``, plus what the DeepStack features it carries add; the separate
        placement's messages between an encoder and the LLM their own, and its control
        input (``EF`` after an earlier ``F``, ``SeparateSchedule.control_inputs``) nothing."""
        kind, _, c = dep
        if kind == Kind.F and consumer.kind == Kind.EF:
            return 0.0
        if self.encoder_output_p2p_s and kind == Kind.EF:
            return self.encoder_output_p2p_s[c]
        if self.encoder_output_p2p_s and kind == Kind.B and c == 0:
            return (self.encoder_grad_p2p_s or self.encoder_output_p2p_s)[consumer.chunk]
        chunk = piece = None
        if kind == Kind.F:
            chunk = c
        elif kind == Kind.B:  # the gradient of chunk c - 1's output, or of an encoder's
            chunk, piece = (c - 1, None) if c > 0 else (None, consumer.chunk)
        elif kind == Kind.EF:
            piece = c
        elif kind == Kind.EB:
            piece = c - 1
        extra = 0.0
        if chunk is not None and self.deepstack_p2p_s:
            extra = self.deepstack_p2p_s[chunk]
        elif piece is not None:
            if self.encoder_deepstack_p2p_s:
                extra = self.encoder_deepstack_p2p_s[piece]
        return self.p2p_s + extra

    def encoder_comm(self, kind: str, piece: int) -> float:
        """The TP all-reduces inside encoder action ``kind`` of ``piece``, seconds."""
        table = self.encoder_forward_comm_s if kind == Kind.EF else self.encoder_backward_comm_s
        return table[piece] if table else 0.0

    def tp_bubble(self, kind: str, chunk: int) -> float:
        """The TP communication inside LLM action ``kind`` of ``chunk``, seconds."""
        table = self.forward_comm_s if kind == Kind.F else self.backward_comm_s
        return table[chunk] if table else 0.0

    def all_to_alls_folded(self) -> "ActionCosts":
        """These costs with each chunk's expert all-to-alls inside its forward and backward
        (what a generator ordering the compute, before ``add_expert_all_to_alls``, sees)."""
        if not self.all_to_all_s:
            return self
        f, b = self.all_to_all_s, self.backward_all_to_all_s or self.all_to_all_s
        add = lambda table, a2a: [t + a for t, a in zip(table, a2a)]  # noqa: E731
        return replace(self, forward_s=add(self.forward_s, f),
                       backward_s=add(self.backward_s, b), all_to_all_s=[],
                       backward_all_to_all_s=[],
                       microbatches=[replace(m, all_to_all_s=f, backward_all_to_all_s=b)
                                     .all_to_alls_folded() for m in self.microbatches])

    def of(self, kind: str, chunk: int, microbatch: Optional[int] = None) -> float:
        if self.microbatches and microbatch is not None and kind in _COMPUTE:
            return self.microbatches[microbatch].of(kind, chunk)
        table = getattr(self, _TABLES[kind])
        if not table and kind not in _COMPUTE:
            return 0.0
        if chunk >= len(table):
            raise PlanError(f"no {kind} cost for chunk / stage {chunk}")
        return table[chunk]


_TABLES = {Kind.F: "forward_s", Kind.B: "backward_s", Kind.EF: "encoder_forward_s",
           Kind.EB: "encoder_backward_s", Kind.BCAST: "broadcast_s",
           Kind.ALLREDUCE: "replica_allreduce_s", Kind.GRAD_SYNC: "reduce_s",
           Kind.ENCODER_GRAD_SYNC: "encoder_reduce_s", Kind.A2A: "all_to_all_s",
           Kind.A2A_B: "backward_all_to_all_s"}


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
    llm_only_iteration_s: Optional[float] = None  # the same schedule, encoder compute free
    # 1 - (iteration_s - llm_only_iteration_s) / max(encoder_busy_s), clipped to [0, 1]; None
    # without encoder actions (an encoder inside LLM chunk 0 cannot be told apart)
    encoder_hidden_fraction: Optional[float] = None

    def chrome_trace(self) -> Dict:
        """Chrome trace events: one row per rank (and one per rank's communication
        stream), LLM, encoder and collective work in separate categories (Perfetto colours
        them apart)."""
        ranks = len(self.busy_s)
        events = [{"name": _label(t), "cat": _category(t.kind), "ph": "X", "pid": 0,
                   "tid": t.rank + (ranks if t.kind in _STREAM else 0),
                   "ts": t.start_s * 1e6, "dur": (t.end_s - t.start_s) * 1e6}
                  for t in self.timeline]
        events += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": r,
                    "args": {"name": f"rank {r}"}} for r in range(ranks)]
        if any(t.kind in _STREAM for t in self.timeline):
            events += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": ranks + r,
                        "args": {"name": f"rank {r} communication"}} for r in range(ranks)]
        return {"traceEvents": events, "displayTimeUnit": "ms"}


_COMPUTE = frozenset((Kind.F, Kind.B, Kind.EF, Kind.EB))
_STREAM = (Kind.GRAD_SYNC, Kind.ENCODER_GRAD_SYNC)  # on the communication stream


def _label(t: TimedAction) -> str:
    if t.kind in (Kind.ALLREDUCE,) + _STREAM:
        return f"{t.kind}.{t.chunk}"
    return f"{t.kind}{t.microbatch}" + (f".{t.chunk}" if t.kind in ("F", "B", "A2A", "A2A_B")
                                        else "")


def _category(kind: str) -> str:
    kind = Kind(kind)
    return "llm" if kind.llm else "encoder" if kind.encoder else "collective"


def simulate(schedule: Schedule, costs: ActionCosts, timeline: bool = True) -> Simulation:
    """Each rank runs its actions in order; an action starts when its rank is free and its
    inputs have arrived (plus ``p2p_s`` when they come from another rank); LLM actions also
    wait for ``llm_start_s`` and a rank ends ``llm_end_s`` after its last LLM action.
    ``GRAD_SYNC`` runs on the rank's communication stream (module docstring).

    The share of encoder work hidden in bubbles (Optimus' "scheduling efficiency", the
    share of encoder computation placed inside LLM bubbles) is measured by what the encoder
    adds to the iteration: ``1 - (T - T_llm) / E``, where T is this schedule's iteration,
    T_llm that of the same schedule with the encoders' computation taking no time (its
    transfers and collectives, e.g. the encoder's gradient reduction, stay), and E the
    encoder busy time of the rank with the most encoder work (what the encoder would add
    were none of it hidden); clipped to [0, 1]. ``timeline=False`` skips the per-action
    records (the planner simulates many schedules and needs the numbers only).
    """
    if costs.reduce_s and not schedule.grad_sync:
        raise PlanError(f"these costs charge the data-parallel reduction at GRAD_SYNC actions, "
                        f"which schedule {schedule.name!r} has none of: generate it with "
                        "grad_sync=True")
    iteration, busy, enc, timeline = _replay(schedule, costs, timeline)
    idle = [iteration - b for b in busy]
    llm_only = hidden = None
    if schedule.encoder_stages and max(enc) > 0:
        llm_only = _replay(schedule, _encoder_free(costs), False)[0]
        hidden = min(1.0, max(0.0, 1.0 - (iteration - llm_only) / max(enc)))
    return Simulation(schedule=schedule.name, iteration_s=iteration, busy_s=busy,
                      idle_s=idle, bubble_fraction=sum(idle) / (iteration * len(busy)),
                      timeline=timeline, encoder_busy_s=enc, llm_only_iteration_s=llm_only,
                      encoder_hidden_fraction=hidden)


def _replay(schedule: Schedule, costs: ActionCosts, record: bool):
    """(iteration, busy per rank, encoder busy per rank, timeline if ``record``)."""
    pp, ranks = schedule.pipeline_model_parallel_size, schedule.num_ranks
    finish: Dict = {}
    owner: Dict = {}
    clock = [0.0] * ranks
    stream = [0.0] * ranks  # the communication stream's clock (GRAD_SYNC)
    host = [(0.0, 0.0)] * ranks  # the last LLM action's (start, TP bubble left), per rank
    llm_end = [0.0] * ranks
    busy = [0.0] * ranks
    enc = [0.0] * ranks
    timeline = []
    start = costs.llm_start_s
    for rank, a in replay_order(schedule):
        llm, on_stream = a.kind.llm, a.kind in _STREAM
        if a.in_tp_bubble:  # inside the previous LLM action's TP communication, if it fits
            duration = costs.of(a.kind, a.chunk, a.microbatch)
            comm = costs.encoder_comm(a.kind, a.chunk)  # on the LLM's links: not hidden
            at, left = host[rank]
            inputs = max([finish[d] + (costs.transfer_s(d, a) if owner[d] != rank else 0.0)
                          for d in schedule.dependencies(a)], default=0.0)
            if inputs <= at + 1e-12 and duration <= left + 1e-12:
                finish[a.key], owner[a.key] = at + duration, rank
                host[rank] = (at + duration, left - duration)
                clock[rank] += comm
                busy[rank] += comm
                enc[rank] += duration
                if record:
                    timeline.append(TimedAction(rank, a.kind, a.microbatch, a.chunk, at,
                                                at + duration))
                continue
        if on_stream:  # its inputs are this rank's own actions, its clock the stream's
            ready = max([stream[rank]] + [finish[d] for d in schedule.dependencies(a)])
        else:
            ready = max(clock[rank], start) if llm else clock[rank]
            for dep in schedule.dependencies(a):
                arrival = finish[dep] + (costs.transfer_s(dep, a) if owner[dep] != rank
                                         else 0.0)
                if arrival > ready:
                    ready = arrival
        duration = costs.of(a.kind, a.chunk, a.microbatch)
        if (a.kind == Kind.GRAD_SYNC and not schedule.encoder_grad_sync and a.chunk < pp
                and costs.encoder_reduce_s):  # the rank's pieces, in its first chunk
            duration += sum(costs.of(Kind.ENCODER_GRAD_SYNC, p)
                            for p in schedule.trained_pieces(a.chunk))
        end = ready + duration
        finish[a.key], owner[a.key] = end, rank
        if on_stream:
            stream[rank] = end
        else:
            clock[rank] = end
            busy[rank] += duration
        if a.kind.expert:  # inside its LLM action: that action's outputs leave now
            finish[schedule.dependencies(a)[0]] = end
            llm_end[rank] = end
        if llm:
            llm_end[rank] = end
            host[rank] = (ready, costs.tp_bubble(a.kind, a.chunk))
        elif a.kind.encoder:
            enc[rank] += duration
        if record:
            timeline.append(TimedAction(rank, a.kind, a.microbatch, a.chunk, ready, end))
    iteration = max(max(c, s, e + costs.llm_end_s)
                    for c, s, e in zip(clock, stream, llm_end))
    return iteration + costs.grad_sync_s + costs.optimizer_s, busy, enc, timeline


def _encoder_free(costs: ActionCosts) -> ActionCosts:
    """The same costs with the encoders' work (their layers and their TP all-reduces)
    taking no time (transfers between ranks and collectives stay): what the schedule would
    take were the encoder work all hidden."""
    return replace(costs, encoder_forward_s=[0.0] * len(costs.encoder_forward_s),
                   encoder_backward_s=[0.0] * len(costs.encoder_backward_s),
                   encoder_forward_comm_s=[], encoder_backward_comm_s=[],
                   microbatches=[_encoder_free(m) for m in costs.microbatches])
