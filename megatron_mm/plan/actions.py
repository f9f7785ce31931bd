"""A pipeline schedule as data: per rank, an ordered list of actions, and its validator.

Actions (``kind``):

- ``F`` / ``B``: LLM forward / backward of micro-batch ``microbatch`` on model chunk
  ``chunk`` (global chunk index v * PP + rank, as in Megatron's interleaving);
- ``EF`` / ``EB``: encoder forward / backward of ``microbatch`` on encoder piece ``chunk``
  (the encoder's own pipeline, by its own plan). Several encoders (vision and audio) number
  their pieces one after the other: ``encoder_pieces`` says how many each has.

Data dependencies (sends and receives are implied where producer and consumer differ in
rank; the simulator charges them):

- ``F(m, 0)`` needs every encoder's last ``EF(m)`` (when encoders run as their own
  actions); ``F(m, c)`` needs ``F(m, c - 1)``;
- ``B(m, last)`` needs ``F(m, last)``; ``B(m, c)`` needs ``B(m, c + 1)``;
- ``EF(m, s)`` needs ``EF(m, s - 1)`` of the same encoder; an encoder's last ``EB(m)``
  needs ``B(m, 0)`` (the gradient of the merged embeddings); ``EB(m, s)`` needs
  ``EB(m, s + 1)`` of the same encoder. A frozen encoder has no ``EB``.

With an encoder TP below the LLM's (``--encoder-tensor-model-parallel-size``), a pipeline
rank's TP group holds several encoder replicas: the schedule stays one action list per
pipeline rank, and each replica runs the ``EF`` / ``EB`` actions of the micro-batches it
owns (``encoder_pipeline.encoder_replica_of``), concurrently with the other replicas.

``validate`` replays the ranks' orders: it names the first dependency no order can satisfy
(a deadlock or an action before its input) and checks every action runs exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .errors import PlanError
from .record import Record


@dataclass
class Action(Record):
    kind: str  # F | B | EF | EB
    microbatch: int
    chunk: int  # LLM chunk (F, B) or encoder piece (EF, EB)

    def __post_init__(self):
        if self.kind not in ("F", "B", "EF", "EB"):
            raise PlanError(f"unknown action kind {self.kind!r}; expected F, B, EF or EB")

    @property
    def key(self) -> Tuple[str, int, int]:
        return (self.kind, self.microbatch, self.chunk)

    def __str__(self) -> str:
        where = "encoder piece" if self.kind.startswith("E") else "chunk"
        return f"{self.kind}(micro-batch {self.microbatch}, {where} {self.chunk})"


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

    @property
    def num_chunks(self) -> int:
        return self.pipeline_model_parallel_size * self.virtual_pipeline_model_parallel_size

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
        if action.kind.startswith("E"):
            return self.encoder_ranks[action.chunk]
        return action.chunk % self.pipeline_model_parallel_size

    def dependencies(self, a: Action) -> List[Tuple[str, int, int]]:
        m, c, last = a.microbatch, a.chunk, self.num_chunks - 1
        if a.kind == "F":
            if c > 0:
                return [("F", m, c - 1)]
            return [("EF", m, end - 1) for _, end in self.encoder_spans()]
        if a.kind == "B":
            return [("F", m, c)] if c == last else [("B", m, c + 1)]
        first, end = self.encoder_span(c)
        if a.kind == "EF":
            return [("EF", m, c - 1)] if c > first else []
        # EB
        if c == end - 1:
            return [("B", m, 0), ("EF", m, c)]
        return [("EB", m, c + 1)]

    def expected_actions(self) -> List[Tuple[str, int, int]]:
        keys = []
        for m in range(self.num_microbatches):
            keys += [("F", m, c) for c in range(self.num_chunks)]
            keys += [("B", m, c) for c in range(self.num_chunks)]
            keys += [("EF", m, s) for s in range(self.encoder_stages)]
            keys += [("EB", m, s) for s in range(self.encoder_stages) if self.encoder_backward(s)]
        return keys


def validate(schedule: Schedule) -> None:
    """Raise ``PlanError`` naming what is wrong; return None for a runnable schedule."""
    if len(schedule.ranks) != schedule.pipeline_model_parallel_size:
        raise PlanError(f"schedule {schedule.name!r} lists {len(schedule.ranks)} ranks for "
                        f"PP={schedule.pipeline_model_parallel_size}")
    if len(schedule.encoder_ranks) != schedule.encoder_stages:
        raise PlanError(f"schedule {schedule.name!r}: {schedule.encoder_stages} encoder "
                        f"stages but {len(schedule.encoder_ranks)} encoder ranks")
    if schedule.encoder_pieces and (sum(schedule.encoder_pieces) != schedule.encoder_stages
                                    or min(schedule.encoder_pieces) < 1):
        raise PlanError(f"schedule {schedule.name!r}: encoder pieces "
                        f"{schedule.encoder_pieces} do not add up to its "
                        f"{schedule.encoder_stages} encoder stages")
    if any(not 0 <= e < len(schedule.encoder_spans()) for e in schedule.frozen_encoders):
        raise PlanError(f"schedule {schedule.name!r}: frozen encoders "
                        f"{schedule.frozen_encoders} are not among its "
                        f"{len(schedule.encoder_spans())} encoders")
    seen: Dict[Tuple[str, int, int], int] = {}
    for rank, actions in enumerate(schedule.ranks):
        for a in actions:
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
                        "model does not have (a frozen encoder has no backward)")
    replay_order(schedule)


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
