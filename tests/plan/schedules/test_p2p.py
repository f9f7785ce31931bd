"""The pipeline's point-to-point exchanges (plan/schedules/p2p.py): what goes out together, in
which order, and that NCCL's rendezvous sends cannot deadlock on any generated schedule."""

import itertools

import pytest

from megatron_mm.plan.schedules.problem import ScheduleProblem
from megatron_mm.plan.schedules.actions import Action, Schedule, validate
from megatron_mm.plan.schedules.bubble import bubble
from megatron_mm.plan.errors import PlanError
from megatron_mm.plan.schedules.generate import coarse, megatron
from megatron_mm.plan.schedules.p2p import Exchange, Transfer, check_rendezvous, p2p_program
from megatron_mm.plan.schedules.simulate import ActionCosts


def _show(program):
    """Per rank, per exchange: ([sends], [receives]) as (peer, key) tuples."""
    return [[([(t.peer, tuple(t.key)) for t in ex.sends],
              [(t.peer, tuple(t.key)) for t in ex.recvs]) for ex in rank] for rank in program]


def test_1f1b_receives_each_message_when_it_is_sent():
    s = megatron(2, 1, 3)  # rank 0: F0 F1 B0 F2 B1 B2; rank 1: F0 B0 F1 B1 F2 B2
    program = _show(p2p_program(s, s.ranks))
    f = lambda m: ("F", m, 0)  # noqa: E731  chunk 0's output
    b = lambda m: ("B", m, 1)  # noqa: E731  chunk 1's input gradient
    # unit costs (backward = 2 forwards): rank 0's F1 ends at 2, when rank 1 starts B0;
    # rank 1's B0 ends at 4, when rank 0 starts B0; its B1 at 7 with rank 0's F2 ...
    assert program[0] == [([], []), ([(1, f(0))], []), ([(1, f(1))], [(1, b(0))]), ([], []),
                          ([(1, f(2))], [(1, b(1))]), ([], [(1, b(2))]), ([], [])]
    assert program[1] == [([], [(0, f(0))]), ([], [(0, f(1))]), ([(0, b(0))], []), ([], []),
                          ([(0, b(1))], [(0, f(2))]), ([], []), ([(0, b(2))], [])]
    check_rendezvous(p2p_program(s, s.ranks))


def test_messages_come_in_the_senders_order_and_wait_for_their_action():
    # rank 0 sends EF(1, 0) before F(0, 0); rank 1 needs F(0, 0) first: it receives both
    # together, in rank 0's order (NCCL matches by order), and keeps EF(1, 0) for EF(1, 1)
    s = Schedule(name="t", pipeline_model_parallel_size=2,
                 virtual_pipeline_model_parallel_size=1, num_microbatches=2,
                 encoder_stages=2, encoder_ranks=[0, 1], ranks=[
                     [Action("EF", 0, 0), Action("EF", 1, 0), Action("F", 0, 0),
                      Action("F", 1, 0), Action("B", 0, 0), Action("B", 1, 0)],
                     [Action("EF", 0, 1), Action("F", 0, 1), Action("B", 0, 1),
                      Action("EF", 1, 1), Action("F", 1, 1), Action("B", 1, 1)]])
    validate(s)
    program = _show(p2p_program(s, s.ranks))
    assert program[1][0] == ([], [(0, ("EF", 0, 0))])
    assert program[1][1] == ([(0, ("EF", 0, 1))], [(0, ("EF", 1, 0)), (0, ("F", 0, 0))])
    assert program[1][3] == ([(0, ("B", 0, 1))], [])  # EF(1, 1): its input is here already


def test_rendezvous_check_catches_a_send_send_cycle():
    a, b = ["F", 0, 0], ["B", 0, 1]
    cycle = [[Exchange(sends=[Transfer(1, a)]), Exchange(recvs=[Transfer(1, b)])],
             [Exchange(sends=[Transfer(0, b)]), Exchange(recvs=[Transfer(0, a)])]]
    with pytest.raises(PlanError, match="rank 0 in exchange 0 waits for the send of "
                                        r"\('F', 0, 0\) to rank 1"):
        check_rendezvous(cycle)
    batched = [[Exchange(sends=[Transfer(1, a)], recvs=[Transfer(1, b)])],
               [Exchange(sends=[Transfer(0, b)], recvs=[Transfer(0, a)])]]
    check_rendezvous(batched)


def test_receives_posted_just_before_their_action_can_hang_timed_ones_cannot():
    # Two encoders, each [piece on rank 0 | piece on rank 1], all forwards first: rank 0
    # keeps sending encoder outputs that rank 1 needs only later, while rank 1's own send
    # waits for rank 0, which would receive it only at F(0, 0)
    s = coarse(ScheduleProblem(2, 2, encoder_trainable=False, encoder_stages=2, pieces=1,
                               encoders=2))
    with pytest.raises(PlanError, match="deadlock"):
        check_rendezvous(p2p_program(s, s.ranks, late=True))
    check_rendezvous(p2p_program(s, s.ranks))


def _schedules():
    for pp, vpp, m, trainable, pieces, encoders in itertools.product(
            (2, 4), (1, 2), (1, 3, 4), (False, True), (1, 2), (1, 2)):
        if vpp > 1 and m % pp:
            continue
        frozen = [1] if encoders == 2 and trainable else []
        yield coarse(ScheduleProblem(pp, m, virtual_pipeline_model_parallel_size=vpp,
                                     encoder_trainable=trainable, encoder_stages=pp // 2,
                                     pieces=pieces, encoders=encoders, frozen_encoders=frozen))
        n = (pp // 2) * pieces * encoders
        costs = ActionCosts([1.0 + c % 3 for c in range(pp * vpp)],
                            [2.0 + c % 2 for c in range(pp * vpp)],
                            encoder_forward_s=[0.5 + p % 4 for p in range(n)],
                            encoder_backward_s=[1.0 + p % 3 for p in range(n)])
        yield bubble(ScheduleProblem(pp, m, virtual_pipeline_model_parallel_size=vpp,
                                     encoder_trainable=trainable, costs=costs,
                                     encoder_stages=pp // 2, pieces=pieces, encoders=encoders,
                                     frozen_encoders=frozen), extra_warmup="auto")


def test_every_generated_schedule_is_rendezvous_safe():
    count = 0
    for s in _schedules():
        subsets = [s.ranks, [[a for a in r if a.kind in ("F", "EF")] for r in s.ranks]]
        subsets += [[[a for a in r if not a.kind.startswith("E") or a.microbatch % 2 == j]
                     for r in s.ranks] for j in range(2)]  # two encoder replicas
        for ranks in subsets:
            check_rendezvous(p2p_program(s, ranks))
            count += 1
    assert count > 100


def test_encoder_replicas_exchange_at_the_same_points_or_they_can_hang():
    """Two encoder replicas (encoder TP 1 in TP 2) meet in every LLM action's TP
    collectives. Each running its own action list with its own program (the other
    replica's encoder actions left out) hangs on this bubble schedule: replica 1 waits in
    ``BCAST`` for replica 0, which waits for a message its pipeline peer sends only after
    a collective that needs replica 1. One program for both, each skipping the other's
    encoder actions and messages in place (what the executor runs), does not."""
    from megatron_mm.plan.schedules.actions import Kind
    from megatron_mm.plan.schedules.p2p import check_replica_rendezvous, check_replicas

    costs = ActionCosts([1.0, 2.0], [2.0, 4.0], [3.0, 3.0, 0.5, 0.5], [6.0, 6.0, 1.0, 1.0])
    s = bubble(ScheduleProblem(2, 4, costs=costs, encoder_stages=2, pieces=2, encoder_replicas=2,
                               grad_sync=True))
    own = [[[a for a in s.ranks[r] if a.kind not in (Kind.EF, Kind.EB) or a.microbatch % 2 == j]
            for r in range(2)] for j in range(2)]
    with pytest.raises(PlanError, match="encoder replicas deadlock.*BCAST"):
        check_replica_rendezvous(s, [p2p_program(s, own[j]) for j in range(2)], own)
    check_replicas(s, s.ranks, p2p_program(s, s.ranks))
    for extra, m in itertools.product((0, 1, 2), (4, 6, 8)):  # and many more
        s = bubble(ScheduleProblem(2, m, costs=costs, encoder_stages=2, pieces=2,
                                   encoder_replicas=2, grad_sync=True), extra_warmup=extra)
        check_replicas(s, s.ranks, p2p_program(s, s.ranks))
