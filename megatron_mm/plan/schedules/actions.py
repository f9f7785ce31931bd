"""A pipeline schedule as data: per rank, an ordered list of actions, and its validator.

Actions (``kind``, a ``Kind``; printed and serialised as its letters):

- ``F`` / ``B``: LLM forward / backward of micro-batch ``microbatch`` on model chunk
  ``chunk`` (global chunk index v * PP + rank, as in Megatron's interleaving);
- ``EF`` / ``EB``: encoder forward / backward of ``microbatch`` on encoder piece ``chunk``
  (the encoder's own pipeline, by its own plan). Several encoders (vision and audio) number
  their pieces one after the other: ``encoder_pieces`` says how many each has.

The collectives the runtime runs besides those are actions too, so the simulator charges
them and the timeline shows them:

- ``BCAST(m, p)``: with encoder replicas (below), encoder piece ``p``'s output (an
  encoder's last piece) broadcast over the LLM's TP group from the replica that owns
  micro-batch ``m``; on the rank of ``F(m, 0)``, which then takes it;
- ``ALLREDUCE(0, r)``: the encoder pieces' gradients on pipeline rank ``r`` summed over
  the replicas, after the rank's last ``EB``;
- ``GRAD_SYNC(0, c)``: model chunk ``c``'s data-parallel gradient reduction starts
  (Megatron-Core DDP's ``start_grad_sync``, asynchronous with ``--overlap-grad-reduce``)
  once nothing adds to its gradients: after its last ``B``, and for a rank's first chunk
  (which holds the rank's encoder pieces) after its last ``EB`` and ``ALLREDUCE``;
- ``ENCODER_GRAD_SYNC(0, p)`` (``encoder_grad_sync``): encoder piece ``p`` reduces its
  gradients on its own (its own buckets and data-parallel group, as in Optimus), after its
  last ``EB`` (and its rank's ``ALLREDUCE``); a rank's first chunk's ``GRAD_SYNC`` then
  waits for its ``B`` only. The training runtime keeps the pieces in the first chunk's
  buffers, so it runs schedules without it;
- ``A2A(m, c)`` / ``A2A_B(m, c)`` (``expert_chunks``): the expert all-to-alls (token
  dispatch and combine over the expert-parallel group) of the MoE layers in chunk ``c``,
  in its forward / backward of micro-batch ``m``; right after ``F(m, c)`` / ``B(m, c)``,
  whose MoE layers run them (Megatron-Core's token dispatcher, inside the action): the
  simulator charges them there, and the action's outputs leave once they are done.

Data dependencies (sends and receives are implied where producer and consumer differ in
rank; the simulator charges them):

- ``F(m, 0)`` needs every encoder's last ``EF(m)`` (when encoders run as their own
  actions; its ``BCAST(m)`` with replicas); ``F(m, c)`` needs ``F(m, c - 1)``;
- ``B(m, last)`` needs ``F(m, last)``; ``B(m, c)`` needs ``B(m, c + 1)``;
- ``EF(m, s)`` needs ``EF(m, s - 1)`` of the same encoder; an encoder's last ``EB(m)``
  needs ``B(m, 0)`` (the gradient of the merged embeddings); ``EB(m, s)`` needs
  ``EB(m, s + 1)`` of the same encoder. A frozen encoder has no ``EB``.

Optimus' tensor-parallel bubbles: an ``EF`` / ``EB`` marked ``in_tp_bubble`` runs while the
LLM action before it on its rank waits for its tensor-parallel all-reduces (GPU compute
idle), its inputs there before that action starts; the simulator charges nothing for it
where it fits in what is left of that communication. The training runtime runs one action
at a time, so it runs schedules without them.

With an encoder TP below the LLM's (``--encoder-tensor-model-parallel-size``), a pipeline
rank's TP group holds ``encoder_replicas`` encoder replicas: the schedule stays one action
list per pipeline rank, and each replica runs the ``EF`` / ``EB`` actions of the
micro-batches it owns (``encoder_pipeline.encoder_replica_of``), concurrently with the
other replicas; every replica runs the collectives.

``validate`` replays the ranks' orders: it names the first dependency no order can satisfy
(a deadlock or an action before its input) and checks every action runs exactly once.
Every generator validates what it returns (``validated``), and the runtime validates the
schedule it is handed before any rank runs an action.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Dict, List, Optional, Tuple

from ..errors import PlanError
from ..record import Record


class Kind(str, Enum):
    """What an action does. A ``str`` whose value is its letters, so a kind prints, keys
    messages and serialises as ``"F"``, and compares equal to that string."""

    F = "F"  # LLM forward of a chunk
    B = "B"  # LLM backward of a chunk
    EF = "EF"  # encoder forward of a piece
    EB = "EB"  # encoder backward of a piece
    BCAST = "BCAST"  # an encoder's output from its replica to the LLM TP group
    ALLREDUCE = "ALLREDUCE"  # a rank's encoder gradients summed over the replicas
    GRAD_SYNC = "GRAD_SYNC"  # a model chunk's data-parallel gradient reduction starts
    ENCODER_GRAD_SYNC = "ENCODER_GRAD_SYNC"  # a rank's encoder pieces' own reduction starts
    A2A = "A2A"  # the expert all-to-alls of a chunk's forward (inside its F)
    A2A_B = "A2A_B"  # ... of its backward (inside its B)

    __hash__ = str.__hash__  # as its letters: ("F", m, c) and (Kind.F, m, c) are one key

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def llm(self) -> bool:
        return self in (Kind.F, Kind.B)

    @property
    def encoder(self) -> bool:
        return self in (Kind.EF, Kind.EB)

    @property
    def compute(self) -> bool:
        return self.llm or self.encoder

    @property
    def collective(self) -> bool:
        return not self.compute

    @property
    def expert(self) -> bool:
        """An expert all-to-all (run inside the LLM action before it)."""
        return self in (Kind.A2A, Kind.A2A_B)


@dataclass
class Action(Record):
    kind: Kind
    microbatch: int  # 0 for the once-per-iteration ALLREDUCE and GRAD_SYNC
    chunk: int  # LLM chunk (F, B, GRAD_SYNC), encoder piece (EF, EB, BCAST,
    # ENCODER_GRAD_SYNC), pipeline rank (ALLREDUCE)
    in_tp_bubble: bool = False  # EF / EB inside the previous LLM action's TP communication

    def __post_init__(self):
        if type(self.kind) is Kind:  # the common case, kept cheap (planners build many)
            return
        try:
            self.kind = Kind(self.kind)
        except ValueError:
            raise PlanError(f"unknown action kind {self.kind!r}; expected one of "
                            f"{', '.join(k.value for k in Kind)}") from None

    @property
    def key(self) -> Tuple[str, int, int]:
        return (self.kind, self.microbatch, self.chunk)

    def __str__(self) -> str:
        if self.kind == Kind.ALLREDUCE:
            return f"ALLREDUCE(encoder replicas, rank {self.chunk})"
        if self.kind == Kind.ENCODER_GRAD_SYNC:
            return f"ENCODER_GRAD_SYNC(encoder piece {self.chunk})"
        if self.kind == Kind.GRAD_SYNC:
            return f"GRAD_SYNC(chunk {self.chunk})"
        if self.kind.expert:
            return f"{self.kind}(micro-batch {self.microbatch}, chunk {self.chunk})"
        where = "chunk" if self.kind.llm else "encoder piece"
        return (f"{self.kind}(micro-batch {self.microbatch}, {where} {self.chunk})"
                + (" in a TP bubble" if self.in_tp_bubble else ""))


@dataclass
class Schedule(Record):
    """What every rank runs, in order, for one iteration."""

    name: str
    pipeline_model_parallel_size: int
    virtual_pipeline_model_parallel_size: int
    num_microbatches: int
    encoder_stages: int = 0  # encoder pieces, all encoders; 0: encoders in LLM chunk 0
    encoder_trainable: bool = False  # whether encoder pieces run backwards (EB)
    encoder_ranks: List[int] = field(default_factory=list)  # rank of each encoder piece
    ranks: List[List[Action]] = field(default_factory=list)
    # Several encoders: the pieces of each, in piece order ([]: one encoder, all pieces),
    # and the encoders (indexes) without backward while another one trains.
    encoder_pieces: List[int] = field(default_factory=list)
    frozen_encoders: List[int] = field(default_factory=list)
    # Encoder replicas per LLM TP group (TP / encoder TP): > 1 adds BCAST and ALLREDUCE.
    encoder_replicas: int = 1
    # Whether the data-parallel reductions' start points are actions (GRAD_SYNC), and
    # whether the encoder pieces reduce on their own (ENCODER_GRAD_SYNC).
    grad_sync: bool = False
    encoder_grad_sync: bool = False
    # The LLM chunks holding MoE layers: their F / B run expert all-to-alls (A2A, A2A_B).
    expert_chunks: List[int] = field(default_factory=list)

    @property
    def num_chunks(self) -> int:
        return self.pipeline_model_parallel_size * self.virtual_pipeline_model_parallel_size

    @property
    def num_ranks(self) -> int:
        """The ranks the schedule lists (a placement with ranks of its own: more than PP)."""
        return self.pipeline_model_parallel_size

    def control_inputs(self, action: Action) -> List[Tuple[str, int, int]]:
        """Dependencies of ``action`` that carry no tensor (in ``dependencies`` too), which
        the p2p program's timeline honours: none here (``separate.SeparateSchedule``)."""
        return []

    def walks_with(self, rank: int) -> List[int]:
        """The ranks (``rank`` among them) that start each action of their alike lists
        together, meeting in collectives inside it, which the p2p program's timeline
        honours: each rank alone here (``separate.SeparateSchedule``)."""
        return [rank]

    def encoder_spans(self) -> List[Tuple[int, int]]:
        """Each encoder's pieces ``[first, end)``."""
        counts = self.encoder_pieces or ([self.encoder_stages] if self.encoder_stages else [])
        spans, start = [], 0
        for n in counts:
            spans.append((start, start + n))
            start += n
        return spans

    def encoder_span(self, piece: int) -> Tuple[int, int]:
        """The pieces ``[first, end)`` of the encoder that piece ``piece`` belongs to."""
        if not self.encoder_pieces:  # one encoder: the common case, kept cheap
            return 0, self.encoder_stages
        return next(s for s in self.encoder_spans() if s[0] <= piece < s[1])

    def encoder_backward(self, piece: int) -> bool:
        """Whether piece ``piece`` runs a backward (``EB``)."""
        return self.encoder_trainable and self.encoder_spans().index(
            self.encoder_span(piece)) not in self.frozen_encoders

    def rank_of(self, action: Action) -> int:
        if action.kind.encoder or action.kind == Kind.ENCODER_GRAD_SYNC:
            return self.encoder_ranks[action.chunk]
        if action.kind == Kind.ALLREDUCE:
            return action.chunk
        if action.kind == Kind.BCAST:  # where F(m, 0) runs
            return 0
        return action.chunk % self.pipeline_model_parallel_size

    def trained_pieces(self, rank: int) -> List[int]:
        """The encoder pieces on ``rank`` that run backwards."""
        return [s for s, r in enumerate(self.encoder_ranks)
                if r == rank and self.encoder_backward(s)]

    def replica_reduce_ranks(self) -> List[int]:
        """The pipeline ranks that sum encoder gradients over replicas (``ALLREDUCE``)."""
        if self.encoder_replicas <= 1:
            return []
        return sorted({self.encoder_ranks[s] for s in range(self.encoder_stages)
                       if self.encoder_backward(s)})

    def dependencies(self, a: Action) -> List[Tuple[str, int, int]]:
        m, c, last = a.microbatch, a.chunk, self.num_chunks - 1
        if a.kind == Kind.F:
            if c > 0:
                return [(Kind.F, m, c - 1)]
            via = Kind.BCAST if self.encoder_replicas > 1 else Kind.EF
            return [(via, m, end - 1) for _, end in self.encoder_spans()]
        if a.kind == Kind.B:
            return [(Kind.F, m, c)] if c == last else [(Kind.B, m, c + 1)]
        if a.kind == Kind.BCAST:
            return [(Kind.EF, m, c)]
        if a.kind == Kind.A2A:
            return [(Kind.F, m, c)]
        if a.kind == Kind.A2A_B:
            return [(Kind.B, m, c)]
        if a.kind == Kind.ALLREDUCE:
            return [(Kind.EB, mb, s) for mb in range(self.num_microbatches)
                    for s in self.trained_pieces(c)]
        if a.kind == Kind.ENCODER_GRAD_SYNC:
            r = self.encoder_ranks[c]
            return [(Kind.EB, mb, c) for mb in range(self.num_microbatches)] + (
                [(Kind.ALLREDUCE, 0, r)] if r in self.replica_reduce_ranks() else [])
        if a.kind == Kind.GRAD_SYNC:
            deps = [(Kind.B, mb, c) for mb in range(self.num_microbatches)]
            if c < self.pipeline_model_parallel_size and not self.encoder_grad_sync:
                deps += self._encoder_grads_final(c)  # the rank's first chunk: its pieces
            return deps
        first, end = self.encoder_span(c)
        if a.kind == Kind.EF:
            return [(Kind.EF, m, c - 1)] if c > first else []
        # EB
        if c == end - 1:
            return [(Kind.B, m, 0), (Kind.EF, m, c)]
        return [(Kind.EB, m, c + 1)]

    def _encoder_grads_final(self, rank: int) -> List[Tuple[str, int, int]]:
        """What adds to rank ``rank``'s encoder pieces' gradients."""
        deps = [(Kind.EB, mb, s) for mb in range(self.num_microbatches)
                for s in self.trained_pieces(rank)]
        if rank in self.replica_reduce_ranks():
            deps.append((Kind.ALLREDUCE, 0, rank))
        return deps

    def encoder_grad_sync_pieces(self) -> List[int]:
        """The pieces with an ``ENCODER_GRAD_SYNC``."""
        if not (self.grad_sync and self.encoder_grad_sync):
            return []
        return [s for s in range(self.encoder_stages) if self.encoder_backward(s)]

    def expected_actions(self) -> List[Tuple[str, int, int]]:
        keys = []
        lasts = [end - 1 for _, end in self.encoder_spans()]
        for m in range(self.num_microbatches):
            keys += [(Kind.F, m, c) for c in range(self.num_chunks)]
            keys += [(Kind.B, m, c) for c in range(self.num_chunks)]
            keys += [(Kind.EF, m, s) for s in range(self.encoder_stages)]
            keys += [(Kind.EB, m, s) for s in range(self.encoder_stages)
                     if self.encoder_backward(s)]
            if self.encoder_replicas > 1:
                keys += [(Kind.BCAST, m, s) for s in lasts]
            keys += [(k, m, c) for c in self.expert_chunks for k in (Kind.A2A, Kind.A2A_B)]
        keys += [(Kind.ALLREDUCE, 0, r) for r in self.replica_reduce_ranks()]
        if self.grad_sync:
            keys += [(Kind.GRAD_SYNC, 0, c) for c in range(self.num_chunks)]
        keys += [(Kind.ENCODER_GRAD_SYNC, 0, p) for p in self.encoder_grad_sync_pieces()]
        return keys


def validate(schedule: Schedule) -> None:
    """Raise ``PlanError`` naming what is wrong; return None for a runnable schedule."""
    if len(schedule.ranks) != schedule.num_ranks:
        raise PlanError(f"schedule {schedule.name!r} lists {len(schedule.ranks)} ranks for "
                        f"{schedule.num_ranks} (PP={schedule.pipeline_model_parallel_size})")
    if len(schedule.encoder_ranks) != schedule.encoder_stages:
        raise PlanError(f"schedule {schedule.name!r}: {schedule.encoder_stages} encoder "
                        f"stages but {len(schedule.encoder_ranks)} encoder ranks")
    if schedule.encoder_pieces and (sum(schedule.encoder_pieces) != schedule.encoder_stages
                                    or min(schedule.encoder_pieces) < 1):
        raise PlanError(f"schedule {schedule.name!r}: encoder pieces "
                        f"{schedule.encoder_pieces} do not add up to its "
                        f"{schedule.encoder_stages} encoder stages")
    if schedule.encoder_replicas < 1 or (schedule.encoder_replicas > 1
                                         and not schedule.encoder_stages):
        raise PlanError(f"schedule {schedule.name!r}: {schedule.encoder_replicas} encoder "
                        "replicas need encoder pieces of their own (at least one replica)")
    if any(not 0 <= c < schedule.num_chunks for c in schedule.expert_chunks):
        raise PlanError(f"schedule {schedule.name!r}: expert chunks "
                        f"{schedule.expert_chunks} are not among its {schedule.num_chunks} "
                        "LLM chunks")
    if any(not 0 <= e < len(schedule.encoder_spans()) for e in schedule.frozen_encoders):
        raise PlanError(f"schedule {schedule.name!r}: frozen encoders "
                        f"{schedule.frozen_encoders} are not among its "
                        f"{len(schedule.encoder_spans())} encoders")
    seen: Dict[Tuple[str, int, int], int] = {}
    for rank, actions in enumerate(schedule.ranks):
        previous = None  # the last compute action (collectives run beside)
        for a in actions:
            if a.in_tp_bubble and not (a.kind.encoder and previous is not None and (
                    previous.kind.llm or previous.in_tp_bubble)):
                raise PlanError(f"rank {rank} runs {a}: only an encoder action right after "
                                "an LLM action (or another one in its bubble) can run in "
                                "that action's tensor-parallel bubble")
            if a.kind.expert and (previous is None or previous.key != (
                    Kind.F if a.kind == Kind.A2A else Kind.B, a.microbatch, a.chunk)):
                raise PlanError(f"rank {rank} runs {a} apart from its LLM action: the expert "
                                "all-to-alls run inside it (right after it in the order)")
            if a.kind.compute:
                previous = a
            if a.kind == Kind.ALLREDUCE and not 0 <= a.chunk < len(schedule.ranks):
                raise PlanError(f"rank {rank} runs {a}: no such pipeline rank")
            if schedule.rank_of(a) != rank:
                raise PlanError(f"rank {rank} runs {a}, which lives on rank "
                                f"{schedule.rank_of(a)}")
            if a.key in seen:
                raise PlanError(f"{a} runs twice (rank {seen[a.key]} and rank {rank}); every "
                                "forward and gradient must run exactly once")
            seen[a.key] = rank
    expected = set(schedule.expected_actions())
    missing = sorted(expected - set(seen))
    if missing:
        raise PlanError(f"schedule {schedule.name!r} never runs {Action(*missing[0])}"
                        f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}")
    extra = sorted(set(seen) - expected)
    if extra:
        raise PlanError(f"schedule {schedule.name!r} runs {Action(*extra[0])}, which this "
                        "model does not have (a frozen encoder has no backward; BCAST and "
                        "ALLREDUCE need encoder replicas, GRAD_SYNC a schedule with "
                        "grad_sync, ENCODER_GRAD_SYNC also encoder_grad_sync, A2A / "
                        "A2A_B a chunk among expert_chunks)")
    replay_order(schedule)


def validated(generator: Callable[..., Schedule]) -> Callable[..., Schedule]:
    """A schedule generator whose every output is validated before anyone can run it: an
    invalid schedule is a ``PlanError`` at generation, never a hang."""
    @functools.wraps(generator)
    def generate(*args, **kwargs) -> Schedule:
        schedule = generator(*args, **kwargs)
        validate(schedule)
        return schedule
    return generate


def replay_order(schedule: Schedule) -> List[Tuple[int, Action]]:
    """A global order in which every action's inputs exist when it starts (each rank in its
    own order); raises ``PlanError`` naming the blocked actions if there is none."""
    position = [0] * len(schedule.ranks)
    done = set()
    order: List[Tuple[int, Action]] = []
    total = sum(len(r) for r in schedule.ranks)
    while len(order) < total:
        progressed = False
        for rank, actions in enumerate(schedule.ranks):
            while position[rank] < len(actions):
                a = actions[position[rank]]
                if any(d not in done for d in schedule.dependencies(a)):
                    break
                done.add(a.key)
                order.append((rank, a))
                position[rank] += 1
                progressed = True
        if not progressed:
            raise PlanError("the schedule deadlocks: " + "; ".join(
                _blocked(schedule, rank, actions[position[rank]], done)
                for rank, actions in enumerate(schedule.ranks)
                if position[rank] < len(actions)))
    return order


def _blocked(schedule: Schedule, rank: int, a: Action, done) -> str:
    need: Optional[Tuple[str, int, int]] = next(
        d for d in schedule.dependencies(a) if d not in done)
    return f"rank {rank} waits in {a} for {Action(*need)}"
