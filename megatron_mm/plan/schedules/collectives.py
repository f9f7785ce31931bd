"""The collectives a schedule runs besides its point-to-point messages, placed as actions.

A generator orders the compute (``F``, ``B``, ``EF``, ``EB``); ``add_collectives`` then
puts each collective where the runtime runs it, as early as its inputs allow:

- ``BCAST(m, p)`` (encoder replicas) right before ``F(m, 0)``, one per encoder, in
  encoder order: ``F(m, 0)`` takes the broadcast output;
- ``ALLREDUCE(0, r)`` (encoder replicas, a trained encoder) right after rank ``r``'s last
  ``EB``: no later encoder backward adds to the gradients it sums;
- ``GRAD_SYNC(0, c)`` right after the last action that adds to chunk ``c``'s gradients (its
  last ``B``; for a rank's first chunk, which holds the rank's encoder pieces, also its
  last ``EB`` and the ``ALLREDUCE``), so the data-parallel reduction runs under the rest of
  the schedule;
- ``ENCODER_GRAD_SYNC(0, p)`` (``encoder_grad_sync``) right after piece ``p``'s last
  ``EB`` (and its rank's ``ALLREDUCE``).

An MoE LLM's expert all-to-alls run inside the LLM actions (Megatron-Core's token
dispatcher), so ``add_expert_all_to_alls`` puts ``A2A(m, c)`` / ``A2A_B(m, c)`` right after
``F(m, c)`` / ``B(m, c)`` of every chunk ``c`` with MoE layers, whatever generated the order.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from ..errors import PlanError

from .actions import Action, Kind, Schedule, validate


def add_collectives(schedule: Schedule, encoder_replicas: int = 1, grad_sync: bool = False,
                    encoder_grad_sync: bool = False) -> Schedule:
    """``schedule`` (compute actions only) with ``encoder_replicas``, ``grad_sync`` and
    ``encoder_grad_sync`` set and its collectives placed; returns it (changed in place)."""
    schedule.encoder_replicas, schedule.grad_sync = encoder_replicas, grad_sync
    schedule.encoder_grad_sync = encoder_grad_sync
    if encoder_replicas > 1:
        lasts = [end - 1 for _, end in schedule.encoder_spans()]
        schedule.ranks = [
            [b for a in actions
             for b in ([Action(Kind.BCAST, a.microbatch, s) for s in lasts]
                       if a.kind == Kind.F and a.chunk == 0 else []) + [a]]
            for actions in schedule.ranks]
    extra = [Action(Kind.ALLREDUCE, 0, r) for r in schedule.replica_reduce_ranks()]
    _insert_after_inputs(schedule, extra)
    if grad_sync:
        _insert_after_inputs(schedule, [Action(Kind.GRAD_SYNC, 0, c)
                                        for c in range(schedule.num_chunks)] + [
            Action(Kind.ENCODER_GRAD_SYNC, 0, p) for p in schedule.encoder_grad_sync_pieces()])
    return schedule


def add_expert_all_to_alls(schedule: Schedule, expert_chunks) -> Schedule:
    """``schedule`` with the expert all-to-alls of the LLM chunks ``expert_chunks`` (those
    holding MoE layers) as actions, validated; returns it (changed in place). Every rank of
    an expert-parallel group runs the same order, so they meet in each all-to-all in turn."""
    chunks = sorted(set(expert_chunks))
    if not chunks:
        return schedule
    if schedule.expert_chunks:
        raise PlanError(f"schedule {schedule.name!r} has its expert all-to-alls already")
    schedule.expert_chunks = chunks
    after = {Kind.F: Kind.A2A, Kind.B: Kind.A2A_B}
    schedule.ranks = [
        [b for a in actions
         for b in [a] + ([Action(after[a.kind], a.microbatch, a.chunk)]
                         if a.kind.llm and a.chunk in chunks else [])]
        for actions in schedule.ranks]
    validate(schedule)
    return schedule


def _insert_after_inputs(schedule: Schedule, actions: List[Action]) -> None:
    """Each of ``actions`` right after the last of its inputs on its own rank (at the front
    when it has none there)."""
    for rank, order in enumerate(schedule.ranks):
        position: Dict[Tuple[str, int, int], int] = {a.key: i for i, a in enumerate(order)}
        after: Dict[int, List[Action]] = {}
        for a in actions:
            if schedule.rank_of(a) == rank:
                i = max((position[d] for d in schedule.dependencies(a) if d in position),
                        default=-1)
                after.setdefault(i, []).append(a)
        merged = after.get(-1, [])
        for i, a in enumerate(order):
            merged += [a] + after.get(i, [])
        schedule.ranks[rank] = merged
