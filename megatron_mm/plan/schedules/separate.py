"""The separate (non-colocated) placement as one p2p program: encoder ranks of their own
next to the LLM's ranks.

The world holds ``--encoder-data-parallel-size`` encoder replicas of
``--encoder-tensor-model-parallel-size`` ranks each (the first ranks, as Megatron-Bridge's
MIMO places its encoder modules at rank offset 0) and, after them, the LLM's ranks with
their usual TP / PP / CP and a data-parallel size of what is left
(``placement_sizes``). Every encoder runs whole on an encoder replica (its TP ranks walk
the same list, as an LLM stage's TP ranks do); several encoders share the replicas.

The program is a ``Schedule`` whose ranks are the IR ranks of the whole world: LLM data-
parallel replica d's pipeline rank r is IR rank ``d * PP + r``, encoder replica e is IR
rank ``D * PP + e`` (D: the LLM's data-parallel size). Micro-batches are numbered over the
whole iteration: replica d's local micro-batch m is ``d * M + m``. The encoder replicas
take the micro-batches in the order the LLM needs them (``need_order``: local micro-batch
first, then LLM replica), round-robin, so encoder DP need not equal or divide LLM DP. Each
encoder output goes to the LLM replica's first stage (``F(g, 0)``), its gradient comes back
from ``B(g, 0)`` when the encoder trains.

An encoder replica runs ahead of the LLM by at most ``lookahead`` of its micro-batches:
its forward of a micro-batch waits until the LLM has started the forward of the one
``lookahead`` places earlier on that replica (``control_inputs``, a dependency without a
payload: the runtime sees it as that earlier output's send completing, which needs the
LLM's matching receive). So the LLM's first stage holds at most that many encoder outputs
it has not used, and a frozen encoder cannot run arbitrarily far ahead.

The LLM keeps Megatron-Core's 1F1B (or interleaved) order; the encoder replicas' orders
are list-scheduled on the run's per-action costs (``ActionCosts``; unit costs without):
whenever a replica is free it runs, of the actions whose inputs are there, the one that can
start first, a backward before a forward (it frees activations), then the one the LLM needs
first. The result is validated like every schedule (``actions.validated``), its exchanges
laid out and checked for NCCL safety by ``p2p.p2p_program``, and replayed by
``simulate.simulate``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import PlanError
from ..record import Record
from .actions import Action, Kind, Schedule, validated
from .generate import llm_order
from .simulate import ActionCosts

Key = Tuple[str, int, int]


@dataclass
class SeparateSizes(Record):
    """The world split into encoder ranks and LLM ranks (``placement_sizes``)."""

    encoder_tensor_model_parallel_size: int
    encoder_data_parallel_size: int
    llm_data_parallel_size: int

    @property
    def encoder_ranks(self) -> int:
        return self.encoder_tensor_model_parallel_size * self.encoder_data_parallel_size


def placement_sizes(world_size: int, tensor_model_parallel_size: int,
                    pipeline_model_parallel_size: int, context_parallel_size: int,
                    encoder_tensor_model_parallel_size: int,
                    encoder_data_parallel_size: int) -> SeparateSizes:
    """The LLM's data-parallel size once the encoder ranks are taken; a ``PlanError``
    naming the flag when the sizes do not fit."""
    etp, edp = encoder_tensor_model_parallel_size, encoder_data_parallel_size
    if etp < 1:
        raise PlanError(f"--encoder-tensor-model-parallel-size must be at least 1 (got {etp})")
    if edp < 1:
        raise PlanError(f"--encoder-data-parallel-size must be at least 1 (got {edp})")
    llm = world_size - etp * edp
    model = tensor_model_parallel_size * pipeline_model_parallel_size * context_parallel_size
    if llm < 1 or llm % model:
        raise PlanError(
            f"--encoder-schedule separate: the world's {world_size} ranks less the "
            f"{etp * edp} encoder ranks (--encoder-tensor-model-parallel-size {etp} x "
            f"--encoder-data-parallel-size {edp}) leave {llm} for the LLM, not a multiple of "
            f"--tensor-model-parallel-size x --pipeline-model-parallel-size x "
            f"--context-parallel-size ({model})")
    return SeparateSizes(etp, edp, llm // model)


@dataclass
class SeparateSchedule(Schedule):
    """A ``Schedule`` over the whole world's IR ranks (module docstring): the LLM replicas'
    pipeline ranks, then the encoder replicas. ``num_microbatches`` counts every LLM
    replica's micro-batches (``llm_data_parallel_size`` x ``microbatches_per_replica``)."""

    llm_data_parallel_size: int = 1
    encoder_data_parallel_size: int = 1
    microbatches_per_replica: int = 0
    lookahead: int = 2

    @property
    def num_ranks(self) -> int:
        return (self.llm_data_parallel_size * self.pipeline_model_parallel_size
                + self.encoder_data_parallel_size)

    def llm_replica(self, g: int) -> int:
        return g // self.microbatches_per_replica

    def need_order(self, g: int) -> int:
        """Where micro-batch ``g`` comes in the order the LLM replicas need encoder
        outputs: local micro-batch first, then replica."""
        m, d = g % self.microbatches_per_replica, self.llm_replica(g)
        return m * self.llm_data_parallel_size + d

    def encoder_replica(self, g: int) -> int:
        return self.need_order(g) % self.encoder_data_parallel_size

    def encoder_rank(self, e: int) -> int:
        return self.llm_data_parallel_size * self.pipeline_model_parallel_size + e

    def replica_microbatches(self, e: int) -> List[int]:
        """Encoder replica ``e``'s micro-batches, in the order the LLM needs them."""
        return list(_replica_lists(self.llm_data_parallel_size, self.microbatches_per_replica,
                                   self.encoder_data_parallel_size)[0][e])

    def rank_of(self, action: Action) -> int:
        if action.kind.llm:
            return (self.llm_replica(action.microbatch) * self.pipeline_model_parallel_size
                    + action.chunk % self.pipeline_model_parallel_size)
        if action.kind.encoder:
            return self.encoder_rank(self.encoder_replica(action.microbatch))
        raise PlanError(f"{action}: the separate placement's program has no collectives yet")

    def control_inputs(self, a: Action) -> List[Key]:
        """``EF(g, p)`` waits for ``F(h, 0)``, h the micro-batch ``lookahead`` places
        before g on g's encoder replica (module docstring)."""
        if a.kind != Kind.EF:
            return []
        lists, at = _replica_lists(self.llm_data_parallel_size, self.microbatches_per_replica,
                                   self.encoder_data_parallel_size)
        mine, i = lists[self.encoder_replica(a.microbatch)], at[a.microbatch]
        return [(Kind.F, mine[i - self.lookahead], 0)] if i >= self.lookahead else []

    def dependencies(self, a: Action) -> List[Key]:
        return super().dependencies(a) + self.control_inputs(a)


@functools.lru_cache(maxsize=64)
def _replica_lists(d: int, m: int, e: int) -> Tuple[Tuple[Tuple[int, ...], ...],
                                                    Dict[int, int]]:
    """Each encoder replica's micro-batches in need order, and each micro-batch's place in
    its replica's list (planners ask for them once per action)."""
    need = sorted(range(d * m), key=lambda g: (g % m) * d + g // m)
    lists = tuple(tuple(need[e0::e]) for e0 in range(e))
    return lists, {g: i for mine in lists for i, g in enumerate(mine)}


@validated
def separate(pp: int, vpp: int, microbatches_per_replica: int, llm_data_parallel_size: int,
             encoder_data_parallel_size: int, encoder_trainable: bool, encoders: int = 1,
             frozen_encoders: Sequence[int] = (), lookahead: Optional[int] = None,
             costs: Optional[ActionCosts] = None) -> SeparateSchedule:
    """The separate placement's program (module docstring). ``costs``: seconds per action
    (``forward_s`` / ``backward_s`` per LLM chunk, ``encoder_forward_s`` /
    ``encoder_backward_s`` per encoder on one encoder replica, ``p2p_s`` per message), by
    which the encoder replicas' orders are chosen; ``lookahead`` defaults to PP + 1
    micro-batches (enough to cover the LLM's 1F1B warm-up on each replica)."""
    if encoders < 1:
        raise PlanError(f"the separate placement needs at least one encoder (got {encoders})")
    if min(llm_data_parallel_size, encoder_data_parallel_size,
           microbatches_per_replica) < 1:
        raise PlanError("the separate placement needs at least one LLM replica, one encoder "
                        "replica and one micro-batch per LLM replica")
    lookahead = pp + 1 if lookahead is None else lookahead
    if lookahead < 1:
        raise PlanError(f"the encoders' lookahead must be at least one micro-batch (got "
                        f"{lookahead})")
    d, m = llm_data_parallel_size, microbatches_per_replica
    schedule = SeparateSchedule(
        name="separate", pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp, num_microbatches=d * m,
        encoder_stages=encoders, encoder_trainable=encoder_trainable,
        # nominal (encoder replica 0): ``rank_of`` places each micro-batch's pieces
        encoder_ranks=[d * pp] * encoders,
        encoder_pieces=[1] * encoders if encoders > 1 else [],
        frozen_encoders=sorted(frozen_encoders), llm_data_parallel_size=d,
        encoder_data_parallel_size=encoder_data_parallel_size,
        microbatches_per_replica=m, lookahead=lookahead)
    llm = [[Action(a.kind, r // pp * m + a.microbatch, a.chunk)
            for a in llm_order(pp, vpp, m, r % pp)] for r in range(d * pp)]
    schedule.ranks = llm + _encoder_orders(schedule, llm, costs)
    return schedule


def _encoder_orders(s: SeparateSchedule, llm: List[List[Action]],
                    costs: Optional[ActionCosts]) -> List[List[Action]]:
    """List scheduling: the LLM ranks in their fixed orders, each encoder replica choosing
    its next action when free; always the globally earliest start next, so a choice never
    precedes an action that could have started before it."""
    def cost(a: Action) -> float:
        if costs is None:
            return 2.0 if a.kind in (Kind.B, Kind.EB) else 1.0
        return costs.of(a.kind, a.chunk, a.microbatch)

    finish: Dict[Key, float] = {}
    owner: Dict[Key, int] = {}
    llm_ranks = len(llm)
    clock = [0.0] * s.num_ranks
    at = [0] * llm_ranks
    todo: List[List[Action]] = []  # per encoder replica, what it has left
    for e in range(s.encoder_data_parallel_size):
        mine = s.replica_microbatches(e)
        todo.append([Action(Kind.EF, g, p) for g in mine for p in range(s.encoder_stages)]
                    + [Action(Kind.EB, g, p) for g in mine for p in range(s.encoder_stages)
                       if s.encoder_backward(p)])
    orders: List[List[Action]] = [[] for _ in todo]

    def start(rank: int, a: Action) -> Optional[float]:
        deps = s.dependencies(a)
        if any(k not in finish for k in deps):
            return None
        return max([clock[rank]] + [finish[k] + (costs.transfer_s(k, a)
                                                 if costs is not None and owner[k] != rank
                                                 else 0.0) for k in deps])

    while any(at[r] < len(llm[r]) for r in range(llm_ranks)) or any(todo):
        best = None  # (start, preference, rank, action)
        for r in range(llm_ranks):
            if at[r] < len(llm[r]):
                t = start(r, llm[r][at[r]])
                if t is not None and (best is None or t < best[0]):
                    best = (t, (0, 0), r, llm[r][at[r]])
        for e, left in enumerate(todo):
            rank = s.encoder_rank(e)
            # each encoder's forwards go in need order: only its first one left can start
            firsts = {}
            for a in left:
                if a.kind == Kind.EF:
                    firsts.setdefault(a.chunk, a)
            for a in list(firsts.values()) + [a for a in left if a.kind == Kind.EB]:
                t = start(rank, a)
                if t is None:
                    continue
                pref = (0 if a.kind == Kind.EB else 1, s.need_order(a.microbatch))
                if best is None or (t, pref) < best[:2]:
                    best = (t, pref, rank, a)
        if best is None:
            raise PlanError("the separate placement's program deadlocks (no rank can start "
                            "its next action)")
        t, _, rank, a = best
        finish[a.key], owner[a.key] = t + cost(a), rank
        clock[rank] = finish[a.key]
        if rank < llm_ranks:
            at[rank] += 1
        else:
            e = rank - llm_ranks
            todo[e].remove(a)
            orders[e].append(a)
    return orders
