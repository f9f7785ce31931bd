"""The separate (non-colocated) placement as one p2p program: encoder ranks of their own
next to the LLM's ranks.

The world holds ``--encoder-data-parallel-size`` encoder replicas of
``--encoder-tensor-model-parallel-size`` ranks each (the first ranks, as Megatron-Bridge's
MIMO places its encoder modules at rank offset 0) and, after them, the LLM's ranks with
their usual TP / PP / CP and a data-parallel size of what is left
(``placement_sizes``). Every encoder runs whole on an encoder replica (its TP ranks walk
the same list, as an LLM stage's TP x CP ranks do: ``Members``, which says how the
messages between the two fan out, and ``check_members`` that they cannot hang); several
encoders share the replicas, or each encoder has replicas of its own
(``encoder_data_parallel_sizes``: per encoder, as each module of Megatron-Bridge's MIMO has
its own ``data_parallel_size`` at its own rank offset), the encoders' replica sets one
after another in chain order.

The program is a ``Schedule`` whose ranks are the IR ranks of the whole world: LLM data-
parallel replica d's pipeline rank r is IR rank ``d * PP + r``, encoder replica e is IR
rank ``D * PP + e`` (D: the LLM's data-parallel size; e numbered over every encoder's
replicas). Micro-batches are numbered over the
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
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import PlanError
from ..record import Record
from .actions import Action, Kind, Schedule, validated
from .generate import llm_order
from .p2p import Exchange, Transfer, check_group_rendezvous
from .problem import ScheduleProblem
from .simulate import ActionCosts

Key = Tuple[str, int, int]


@dataclass
class SeparateSizes(Record):
    """The world split into encoder ranks and LLM ranks (``placement_sizes``).
    ``encoder_data_parallel_size``: every encoder replica; ``encoder_data_parallel_sizes``
    (each encoder on replicas of its own): each encoder's, in chain order, summing to it."""

    encoder_tensor_model_parallel_size: int
    encoder_data_parallel_size: int
    llm_data_parallel_size: int
    encoder_data_parallel_sizes: List[int] = field(default_factory=list)

    @property
    def encoder_ranks(self) -> int:
        return self.encoder_tensor_model_parallel_size * self.encoder_data_parallel_size


def placement_sizes(world_size: int, tensor_model_parallel_size: int,
                    pipeline_model_parallel_size: int, context_parallel_size: int,
                    encoder_tensor_model_parallel_size: int,
                    encoder_data_parallel_size: int,
                    encoder_data_parallel_sizes: Sequence[int] = (),
                    encoder_names: Sequence[str] = ()) -> SeparateSizes:
    """The LLM's data-parallel size once the encoder ranks are taken; a ``PlanError``
    naming the flag when the sizes do not fit. ``encoder_data_parallel_sizes``: each
    encoder on replicas of its own (``encoder_data_parallel_size`` is then their sum),
    ``encoder_names`` the encoders they are of (the flags the message names)."""
    etp, edp = encoder_tensor_model_parallel_size, encoder_data_parallel_size
    if encoder_data_parallel_sizes:
        if min(encoder_data_parallel_sizes) < 1:
            raise PlanError(f"each encoder's data-parallel size must be at least 1 (got "
                            f"{list(encoder_data_parallel_sizes)})")
        edp = sum(encoder_data_parallel_sizes)
    if etp < 1:
        raise PlanError(f"--encoder-tensor-model-parallel-size must be at least 1 (got {etp})")
    if edp < 1:
        raise PlanError(f"--encoder-data-parallel-size must be at least 1 (got {edp})")
    llm = world_size - etp * edp
    model = tensor_model_parallel_size * pipeline_model_parallel_size * context_parallel_size
    if llm < 1 or llm % model:
        names = list(encoder_names) or [f"encoder-{p}" for p in
                                        range(len(encoder_data_parallel_sizes))]
        replicas = (f"--encoder-data-parallel-size {edp}" if not encoder_data_parallel_sizes
                    else "(" + " + ".join(f"--{n}-encoder-data-parallel-size {k}" for n, k
                                          in zip(names, encoder_data_parallel_sizes)) + ")")
        raise PlanError(
            f"--encoder-schedule separate: the world's {world_size} ranks less the "
            f"{etp * edp} encoder ranks (--encoder-tensor-model-parallel-size {etp} x "
            f"{replicas}) leave {llm} for the LLM, not a multiple of "
            f"--tensor-model-parallel-size x --pipeline-model-parallel-size x "
            f"--context-parallel-size ({model})")
    return SeparateSizes(etp, edp, llm // model, list(encoder_data_parallel_sizes))


@dataclass
class SeparateSchedule(Schedule):
    """A ``Schedule`` over the whole world's IR ranks (module docstring): the LLM replicas'
    pipeline ranks, then the encoder replicas. ``num_microbatches`` counts every LLM
    replica's micro-batches (``llm_data_parallel_size`` x ``microbatches_per_replica``);
    ``encoder_data_parallel_size`` every encoder replica, ``encoder_data_parallel_sizes``
    (empty: the encoders share every replica) each encoder's own."""

    llm_data_parallel_size: int = 1
    encoder_data_parallel_size: int = 1
    microbatches_per_replica: int = 0
    lookahead: int = 2
    encoder_data_parallel_sizes: List[int] = field(default_factory=list)
    # the LLM replicas whose stages meet in collectives inside their actions (``separate``)
    lockstep_replicas: int = 1

    def walks_with(self, rank: int) -> List[int]:
        """An LLM rank: its stage on the ``lockstep_replicas`` replicas of its group."""
        pp, together = self.pipeline_model_parallel_size, self.lockstep_replicas
        if rank >= self.llm_data_parallel_size * pp or together == 1:
            return [rank]
        first = rank // pp // together * together
        return [d * pp + rank % pp for d in range(first, first + together)]

    def replica_set(self, p: int) -> Tuple[int, int]:
        """Encoder ``p``'s replicas: (the first one's number, how many)."""
        if not self.encoder_data_parallel_sizes:
            return 0, self.encoder_data_parallel_size
        sizes = self.encoder_data_parallel_sizes
        return sum(sizes[:p]), sizes[p]

    def replica_encoders(self, e: int) -> List[int]:
        """The encoders replica ``e`` runs."""
        return [p for p in range(self.encoder_stages)
                if 0 <= e - self.replica_set(p)[0] < self.replica_set(p)[1]]

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

    def encoder_replica(self, g: int, p: int = 0) -> int:
        """The replica that runs encoder ``p`` on micro-batch ``g``."""
        first, size = self.replica_set(p)
        return first + self.need_order(g) % size

    def encoder_rank(self, e: int) -> int:
        return self.llm_data_parallel_size * self.pipeline_model_parallel_size + e


    def replica_microbatches(self, e: int) -> List[int]:
        """Encoder replica ``e``'s micro-batches, in the order the LLM needs them."""
        first, size = self.replica_set(self.replica_encoders(e)[0])
        return list(_replica_lists(self.llm_data_parallel_size, self.microbatches_per_replica,
                                   size)[0][e - first])

    def rank_of(self, action: Action) -> int:
        if action.kind.llm:
            return (self.llm_replica(action.microbatch) * self.pipeline_model_parallel_size
                    + action.chunk % self.pipeline_model_parallel_size)
        if action.kind.encoder:
            return self.encoder_rank(self.encoder_replica(action.microbatch, action.chunk))
        raise PlanError(f"{action}: the separate placement's program has no collectives yet")

    def control_inputs(self, a: Action) -> List[Key]:
        """``EF(g, p)`` waits for ``F(h, 0)``, h the micro-batch ``lookahead`` places
        before g on g's encoder replica (module docstring)."""
        if a.kind != Kind.EF:
            return []
        first, size = self.replica_set(a.chunk)
        lists, at = _replica_lists(self.llm_data_parallel_size, self.microbatches_per_replica,
                                   size)
        mine, i = lists[self.encoder_replica(a.microbatch, a.chunk) - first], at[a.microbatch]
        return [(Kind.F, mine[i - self.lookahead], 0)] if i >= self.lookahead else []

    def dependencies(self, a: Action) -> List[Key]:
        return super().dependencies(a) + self.control_inputs(a)


@dataclass
class Members(Record):
    """The processes that run one rank of the program together: an LLM rank's TP x CP ranks
    (``llm``, numbered tp + TP * cp as in Megatron-Core's order), an encoder replica's
    ``--encoder-tensor-model-parallel-size`` ranks (``encoder``); the program's first
    ``llm_ranks`` ranks are the LLM's. They walk the same list, meeting in the collectives
    inside its actions. A message between an encoder and the LLM goes from the sender's
    member 0 to every member of the receiver (each needs the encoder output, or its
    gradient, whole; the sender's members hold the same); a message between LLM ranks from
    each member to the same member (Megatron-Core's p2p). The stage ranks of
    ``lockstep_replicas`` consecutive LLM replicas meet in collectives inside their actions
    too (an MoE LLM's expert all-to-alls: ``expert_replicas()``; FP8's amax reductions):
    they walk their (alike) lists together."""

    llm: int = 1
    encoder: int = 1
    llm_ranks: int = 1
    lockstep_replicas: int = 1
    llm_stages: int = 1  # the LLM's PP: IR rank d * PP + r


    def of(self, ir: int) -> int:
        return self.encoder if ir >= self.llm_ranks else self.llm

    def crosses(self, ir: int, peer: int) -> bool:
        return (ir >= self.llm_ranks) != (peer >= self.llm_ranks)

    def targets(self, ir: int, k: int, peer: int) -> List[Tuple[int, int]]:
        """The (peer, member) pairs member ``k`` of rank ``ir`` sends a message for
        ``peer`` to."""
        if not self.crosses(ir, peer):
            return [(peer, k)]
        return [(peer, j) for j in range(self.of(peer))] if k == 0 else []

    def source(self, ir: int, k: int, peer: int) -> Tuple[int, int]:
        """The (peer, member) member ``k`` of rank ``ir`` receives a message of ``peer``
        from."""
        return (peer, 0) if self.crosses(ir, peer) else (peer, k)


def expert_replicas(tensor_model_parallel_size: int, context_parallel_size: int,
                    expert_model_parallel_size: int,
                    expert_tensor_parallel_size: Optional[int]) -> int:
    """The LLM replicas whose ranks of a stage meet in an MoE LLM's expert collectives (1: a
    dense LLM): Megatron-Core numbers a stage's ranks tp + TP * cp + TP * CP * d, and its
    experts' groups are ETP x EP consecutive ones of them, so groups of both kinds close
    over lcm(TP x CP, ETP x EP) ranks."""
    llm = tensor_model_parallel_size * context_parallel_size
    experts = expert_model_parallel_size * (expert_tensor_parallel_size
                                            or tensor_model_parallel_size)
    return math.lcm(llm, experts) // llm


def check_members(s: SeparateSchedule, ranks: Sequence[Sequence[Action]],
                  program: List[List[Exchange]], members: Members) -> None:
    """Raise ``PlanError`` if ``program`` (the exchanges of ``s``'s action lists ``ranks``)
    can hang once each rank is run by its ``members``: the messages fanned out and gathered as
    ``Members`` says, and every member of a rank meeting the others in each of its actions
    (their TP / CP collectives, and with the same stage of the other replicas of
    ``Members.lockstep_replicas``)."""
    if (members.llm, members.encoder, members.lockstep_replicas) == (1, 1, 1):
        return
    base = [0]
    for ir in range(len(ranks)):
        base.append(base[-1] + members.of(ir))
    pp, together = members.llm_stages, members.lockstep_replicas
    programs, actions, groups = [], [], []
    for ir, exchanges in enumerate(program):
        group = list(range(base[ir], base[ir + 1]))
        if ir < members.llm_ranks and together > 1:
            first = ir // pp // together * together
            group = [base[d * pp + ir % pp] + k for d in range(first, first + together)
                     for k in range(members.llm)]
        for k in range(base[ir + 1] - base[ir]):
            programs.append([Exchange(
                [Transfer(base[p] + j, t.key) for t in ex.sends
                 for p, j in members.targets(ir, k, t.peer)],
                [Transfer(base[p] + j, t.key) for t in ex.recvs
                 for p, j in [members.source(ir, k, t.peer)]]) for ex in exchanges])
            actions.append(ranks[ir])
            groups.append(group)
    check_group_rendezvous(programs, actions, groups,
                           lambda a: a.kind in (Kind.F, Kind.B, Kind.EF, Kind.EB))


@functools.lru_cache(maxsize=64)
@functools.lru_cache(maxsize=64)
def _replica_lists(d: int, m: int, e: int) -> Tuple[Tuple[Tuple[int, ...], ...],
                                                    Dict[int, int]]:
    """Each encoder replica's micro-batches in need order, and each micro-batch's place in
    its replica's list (planners ask for them once per action)."""
    need = sorted(range(d * m), key=lambda g: (g % m) * d + g // m)
    lists = tuple(tuple(need[e0::e]) for e0 in range(e))
    return lists, {g: i for mine in lists for i, g in enumerate(mine)}


@validated
def separate(problem: ScheduleProblem) -> SeparateSchedule:
    """The separate placement's program (module docstring) for ``problem``: its
    ``num_microbatches`` per LLM replica (``llm_data_parallel_size`` of them), its
    ``encoder_data_parallel_size`` encoder replicas (``encoder_data_parallel_sizes``: each
    encoder on replicas of its own, so many each, summing to it), its ``costs`` (seconds
    per action: ``forward_s`` / ``backward_s`` per LLM chunk, ``encoder_forward_s`` /
    ``encoder_backward_s`` per encoder on one encoder replica, ``p2p_s`` per message; unit
    costs without), by which the encoder replicas' orders are chosen; ``lookahead``
    defaults to PP + 1 micro-batches (enough to cover the LLM's 1F1B warm-up on each
    replica); ``lockstep_replicas``: the LLM replicas whose stages meet in collectives
    inside their actions (``Members``), which the encoders' orders must not hold apart.
    Each encoder runs whole on a replica: ``layouts`` / pieces do not apply."""
    pp, vpp = problem.pp, problem.vpp
    microbatches_per_replica = problem.num_microbatches
    llm_data_parallel_size = problem.llm_data_parallel_size
    encoder_data_parallel_size = problem.encoder_data_parallel_size
    encoder_trainable, encoders = problem.encoder_trainable, problem.encoders
    frozen_encoders, lookahead = problem.frozen_encoders, problem.lookahead
    costs, lockstep_replicas = problem.costs, problem.lockstep_replicas
    if (problem.layouts or problem.encoder_stages is not None or problem.pieces != 1
            or problem.reverse or problem.encoder_replicas != 1 or problem.grad_sync
            or problem.encoder_grad_sync):
        raise PlanError("the separate placement runs each encoder whole on replicas of its "
                        "own: layouts, encoder_stages, pieces, reverse, encoder_replicas, "
                        "grad_sync and encoder_grad_sync are the colocated schedules' "
                        "(coarse, bubble)")
    if encoders < 1:
        raise PlanError(f"the separate placement needs at least one encoder (got {encoders})")
    own = list(problem.encoder_data_parallel_sizes)
    if own and (len(own) != encoders or sum(own) != encoder_data_parallel_size
                or min(own) < 1):
        raise PlanError(f"each of the {encoders} encoders needs its own data-parallel size, "
                        f"at least 1, summing to {encoder_data_parallel_size} (got {own})")
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
        # nominal (each encoder's first replica): ``rank_of`` places each micro-batch
        encoder_ranks=[d * pp + (sum(own[:p]) if own else 0) for p in range(encoders)],
        encoder_pieces=[1] * encoders if encoders > 1 else [],
        frozen_encoders=sorted(frozen_encoders), llm_data_parallel_size=d,
        encoder_data_parallel_size=encoder_data_parallel_size,
        microbatches_per_replica=m, lookahead=lookahead, encoder_data_parallel_sizes=own,
        lockstep_replicas=lockstep_replicas)
    llm = [[Action(a.kind, r // pp * m + a.microbatch, a.chunk)
            for a in llm_order(pp, vpp, m, r % pp)] for r in range(d * pp)]
    if d % lockstep_replicas:
        raise PlanError(f"{d} LLM replicas do not split into groups of {lockstep_replicas} "
                        "meeting in collectives")
    schedule.ranks = llm + _encoder_orders(schedule, llm, costs)
    return schedule


def _encoder_orders(s: SeparateSchedule, llm: List[List[Action]],
                    costs: Optional[ActionCosts]) -> List[List[Action]]:
    """List scheduling: the LLM ranks in their fixed orders, each encoder replica choosing
    its next action when free; always the globally earliest start next, so a choice never
    precedes an action that could have started before it. An encoder replica's candidates
    are each encoder's first forward left (they go in need order) and the backwards whose
    inputs are done (counted down as they finish), so a step costs the ranks plus the few
    ready actions, not every action left. The LLM ranks that walk together
    (``SeparateSchedule.walks_with``: meeting in the experts' all-to-alls or FP8's amax
    reductions)
    start each action together, once all of them can: an encoder order that waits on one
    replica's backward before feeding its partner's forward would hang them."""
    def cost(a: Action) -> float:
        if costs is None:
            return 2.0 if a.kind in (Kind.B, Kind.EB) else 1.0
        return costs.of(a.kind, a.chunk, a.microbatch)

    finish: Dict[Key, float] = {}
    owner: Dict[Key, int] = {}
    deps: Dict[Key, List[Key]] = {}
    llm_ranks = len(llm)
    clock = [0.0] * s.num_ranks
    at = [0] * llm_ranks
    forwards: List[Dict[int, List[Action]]] = []  # per replica, per encoder: in need order
    ready: List[Dict[int, Action]] = []  # per replica: backwards whose inputs are done,
    waiting: Dict[Key, List[Tuple[int, int, Action]]] = {}  # by their place in the list
    unmet: Dict[Key, int] = {}
    for e in range(s.encoder_data_parallel_size):
        mine, encoders = s.replica_microbatches(e), s.replica_encoders(e)
        forwards.append({p: [Action(Kind.EF, g, p) for g in reversed(mine)] for p in encoders})
        ready.append({})
        backwards = [Action(Kind.EB, g, p) for g in mine for p in encoders
                     if s.encoder_backward(p)]
        for place, a in enumerate(backwards):
            deps[a.key] = s.dependencies(a)
            unmet[a.key] = len(deps[a.key])
            for k in deps[a.key]:
                waiting.setdefault(k, []).append((e, place, a))
    orders: List[List[Action]] = [[] for _ in forwards]

    def start(rank: int, a: Action) -> Optional[float]:
        if a.key not in deps:
            deps[a.key] = s.dependencies(a)
        if any(k not in finish for k in deps[a.key]):
            return None
        return max([clock[rank]] + [finish[k] + (costs.transfer_s(k, a)
                                                 if costs is not None and owner[k] != rank
                                                 else 0.0) for k in deps[a.key]])

    group = {}  # each group of LLM ranks walking together, by its first rank
    for r in range(llm_ranks):
        group.setdefault(s.walks_with(r)[0], s.walks_with(r))
    left = sum(len(r) for r in llm) + sum(len(f) for fs in forwards for f in fs.values()) \
        + len(unmet)
    while left:
        best = None  # (start, preference, rank, action)
        for r, ranks in group.items():
            if at[r] < len(llm[r]):
                times = [start(q, llm[q][at[q]]) for q in ranks]
                t = None if None in times else max(times)
                if t is not None and (best is None or t < best[0]):
                    best = (t, (0, 0), r, llm[r][at[r]])
        for e, fs in enumerate(forwards):
            rank = s.encoder_rank(e)
            heads = sorted((f[-1] for f in fs.values() if f),
                           key=lambda a: (s.need_order(a.microbatch), a.chunk))
            for a in heads + [ready[e][k] for k in sorted(ready[e])]:
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
        for rank, a in ([(q, llm[q][at[q]]) for q in group[rank]] if rank < llm_ranks
                        else [(rank, a)]):
            finish[a.key], owner[a.key] = t + cost(a), rank
            clock[rank] = finish[a.key]
            left -= 1
            for e, place, waiter in waiting.pop(a.key, ()):
                unmet[waiter.key] -= 1
                if not unmet[waiter.key]:
                    ready[e][place] = waiter
            if rank < llm_ranks:
                at[rank] += 1
        if rank >= llm_ranks:
            e = rank - llm_ranks
            if a.kind == Kind.EF:
                forwards[e][a.chunk].pop()
            else:
                del ready[e][next(k for k, b in ready[e].items() if b == a)]
            orders[e].append(a)
    return orders
