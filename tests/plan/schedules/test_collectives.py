"""The IR says everything that runs: action kinds are an enum with a readable form, the
collectives (encoder replicas' broadcast and gradient sum, data-parallel reduction starts)
are actions the generators place and the simulator charges, and every generator's output is
validated as it is generated."""

import json

import pytest

from megatron_mm.plan import PlanError
from megatron_mm.plan.schedules.problem import ScheduleProblem
from megatron_mm.plan.schedules import generate
from megatron_mm.plan.schedules.actions import Action, Kind, Schedule, validate, validated
from megatron_mm.plan.schedules.bubble import bubble
from megatron_mm.plan.schedules.generate import coarse, megatron
from megatron_mm.plan.schedules.simulate import ActionCosts, simulate


def _costs(pp, pieces=1, **collectives):
    n = pp * pieces
    return ActionCosts([1.0] * pp, [2.0] * pp, [1.0 / pieces] * n, [2.0 / pieces] * n,
                       p2p_s=0.01, **collectives)


def test_kinds_are_an_enum_that_reads_and_serialises_as_letters():
    a = Action("EF", 1, 2)
    assert a.kind is Kind.EF and a.kind == "EF" and f"{a.kind}" == "EF"
    assert str(a) == "EF(micro-batch 1, encoder piece 2)"
    assert str(Action(Kind.GRAD_SYNC, 0, 3)) == "GRAD_SYNC(chunk 3)"
    assert json.dumps(a.to_dict()) == (
        '{"kind": "EF", "microbatch": 1, "chunk": 2, "in_tp_bubble": false}')
    assert Action.from_dict(json.loads(json.dumps(a.to_dict()))).kind is Kind.EF
    with pytest.raises(PlanError, match="unknown action kind 'X'"):
        Action("X", 0, 0)
    with pytest.raises(PlanError, match="unknown Kind 'X'"):
        Action.from_dict({"kind": "X", "microbatch": 0, "chunk": 0})


@pytest.mark.parametrize("generator", ["coarse", "bubble"])
def test_collectives_sit_where_the_runtime_runs_them(generator):
    pp, m = 2, 4
    costs = _costs(pp)
    schedule = (coarse(ScheduleProblem(pp, m, encoder_stages=pp, encoder_replicas=2,
                                       grad_sync=True))
                if generator == "coarse" else
                bubble(ScheduleProblem(pp, m, costs=costs, encoder_stages=pp, encoder_replicas=2,
                                       grad_sync=True)))
    assert Schedule.from_dict(json.loads(json.dumps(schedule.to_dict()))) == schedule
    keys = [[a.key for a in r] for r in schedule.ranks]
    for mb in range(m):  # the broadcast of the encoder's last piece right before F(m, 0)
        i = keys[0].index(("F", mb, 0))
        assert keys[0][i - 1] == ("BCAST", mb, 1)
    for r in range(pp):
        order = keys[r]
        last_eb = max(i for i, k in enumerate(order) if k[0] == "EB")
        assert order[last_eb + 1] == ("ALLREDUCE", 0, r)
        last_b = max(i for i, k in enumerate(order) if k[0] == "B")
        # the rank's only chunk holds its encoder piece: it starts after both
        assert order.index(("GRAD_SYNC", 0, r)) == max(last_b, last_eb + 1) + 1
    assert schedule.dependencies(Action("F", 2, 0)) == [("BCAST", 2, 1)]


def test_grad_sync_of_each_chunk_follows_its_last_backward():
    s = megatron(2, 2, 4, grad_sync=True)
    for r, order in enumerate(s.ranks):
        for c in (r, r + 2):
            i = [a.key for a in order].index(("GRAD_SYNC", 0, c))
            assert order[i - 1].kind == "B" and order[i - 1].chunk == c
            assert not any(a.kind == "B" and a.chunk == c for a in order[i:])


def test_the_simulator_charges_the_collectives_and_overlaps_the_reductions():
    pp, m = 2, 4
    plain = simulate(coarse(ScheduleProblem(pp, m, encoder_stages=pp)), _costs(pp))
    schedule = coarse(ScheduleProblem(pp, m, encoder_stages=pp, encoder_replicas=2, grad_sync=True))
    free = simulate(schedule, _costs(pp))  # costs without collectives: they are free
    assert free.iteration_s == pytest.approx(plain.iteration_s)
    bcast = simulate(schedule, _costs(pp, broadcast_s=[0.0, 0.5]))
    # rank 0 runs them between its compute; some fall into its wait for rank 1
    assert plain.iteration_s + 0.5 <= bcast.iteration_s <= plain.iteration_s + m * 0.5
    assert sum(t.end_s - t.start_s for t in bcast.timeline if t.kind == "BCAST") == (
        pytest.approx(m * 0.5))
    reduce = simulate(schedule, _costs(pp, replica_allreduce_s=[0.3, 0.3], reduce_s=[1.5, 1.5]))
    assert reduce.iteration_s == pytest.approx(plain.iteration_s + 0.3 + 1.5)
    kinds = {t.kind for t in reduce.timeline}
    assert {"BCAST", "ALLREDUCE", "GRAD_SYNC"} <= kinds
    trace = reduce.chrome_trace()["traceEvents"]
    assert {e["cat"] for e in trace if e["ph"] == "X"} == {"llm", "encoder", "collective"}
    assert any(e.get("args", {}).get("name") == "rank 1 communication" for e in trace)
    # an early chunk's reduction runs beside later compute: interleaved, only the first
    # chunks' (the last to finish) show
    s = megatron(2, 2, 4, grad_sync=True)
    base = ActionCosts([0.5] * 4, [1.0] * 4)
    hidden = simulate(s, ActionCosts([0.5] * 4, [1.0] * 4, reduce_s=[0.0, 0.0, 0.4, 0.4]))
    shown = simulate(s, ActionCosts([0.5] * 4, [1.0] * 4, reduce_s=[0.4, 0.4, 0.0, 0.0]))
    assert hidden.iteration_s == pytest.approx(simulate(s, base).iteration_s)
    assert shown.iteration_s == pytest.approx(simulate(s, base).iteration_s + 0.4)
    with pytest.raises(PlanError, match="GRAD_SYNC actions, which schedule 'megatron' has none"):
        simulate(megatron(2, 1, 4), ActionCosts([1.0] * 2, [2.0] * 2, reduce_s=[1.0, 1.0]))


def test_misplaced_or_missing_collectives_are_named():
    good = coarse(ScheduleProblem(2, 2, encoder_stages=2, encoder_replicas=2, grad_sync=True))
    early = Schedule.from_dict(good.to_dict())
    sync = next(a for a in early.ranks[1] if a.kind == "GRAD_SYNC")
    early.ranks[1].remove(sync)
    early.ranks[1].insert(0, sync)
    with pytest.raises(PlanError, match=r"rank 1 waits in GRAD_SYNC\(chunk 1\) for B"):
        validate(early)
    missing = Schedule.from_dict(good.to_dict())
    missing.ranks[0] = [a for a in missing.ranks[0] if a.key != ("BCAST", 1, 1)]
    with pytest.raises(PlanError, match=r"never runs BCAST\(micro-batch 1, encoder piece 1\)"):
        validate(missing)
    one_replica = coarse(ScheduleProblem(2, 2, encoder_stages=2))
    one_replica.ranks[0].append(Action("ALLREDUCE", 0, 0))
    with pytest.raises(PlanError, match="ALLREDUCE need encoder replicas"):
        validate(one_replica)


def test_every_generator_validates_what_it_returns(monkeypatch):
    """A generator whose order is broken raises a PlanError as it generates: no schedule
    that cannot run leaves the planner."""
    real = generate.llm_order

    def broken(pp, vpp, m, rank, extra_warmup=0):
        order = real(pp, vpp, m, rank, extra_warmup)
        if rank == pp - 1:  # the last stage runs its first backward before its forward
            order[0], order[1] = order[1], order[0]
        return order

    monkeypatch.setattr(generate, "llm_order", broken)
    with pytest.raises(PlanError, match="deadlocks"):
        megatron(2, 1, 4)
    with pytest.raises(PlanError, match="deadlocks"):
        coarse(ScheduleProblem(2, 4, encoder_stages=2))
    with pytest.raises(PlanError, match="never runs"):
        validated(lambda: Schedule("empty", 1, 1, 1, ranks=[[]]))()


def test_encoder_pieces_reducing_on_their_own_free_the_first_chunk():
    """encoder_grad_sync (Optimus: the encoder has its own data-parallel group): each
    piece's reduction starts after its own last EB, and the rank's first chunk no longer
    waits for the encoder; the runtime (pieces in the first chunk's buffers) reduces them
    with GRAD_SYNC, which the simulator charges there."""
    pp, m = 2, 4
    own = coarse(ScheduleProblem(pp, m, encoder_stages=pp, pieces=2, grad_sync=True,
                                 encoder_grad_sync=True))
    shared = coarse(ScheduleProblem(pp, m, encoder_stages=pp, pieces=2, grad_sync=True))
    for r in range(pp):
        assert own.dependencies(Action("GRAD_SYNC", 0, r)) == [("B", mb, r) for mb in range(m)]
    assert own.dependencies(Action("ENCODER_GRAD_SYNC", 0, 3)) == [
        ("EB", mb, 3) for mb in range(m)]
    order = [a.key for a in own.ranks[1]]  # pieces 2 and 3 on rank 1, EB of 3 first
    assert order.index(("ENCODER_GRAD_SYNC", 0, 3)) == order.index(("EB", m - 1, 3)) + 1
    assert not any(a.kind == "ENCODER_GRAD_SYNC" for r in shared.ranks for a in r)
    costs = _costs(pp, 2, reduce_s=[0.5, 0.5], encoder_reduce_s=[0.25] * 4)
    tail = {}
    for name, s in (("own", own), ("shared", shared)):
        sim = simulate(s, costs)
        streamed = [t for t in sim.timeline if t.kind in ("GRAD_SYNC", "ENCODER_GRAD_SYNC")]
        assert sum(t.end_s - t.start_s for t in streamed) == pytest.approx(2 * 0.5 + 4 * 0.25)
        tail[name] = sim.iteration_s
    assert tail["own"] < tail["shared"]  # piece 3's reduction runs under piece 2's EB


def test_encoder_work_in_tp_bubbles_is_free_where_it_fits():
    """Optimus' TP bubbles: LLM actions wait on their TP all-reduces; encoder pieces small
    enough run there (the bubble generator places them, the simulator charges nothing
    for them), larger ones do not; a misplaced one is named."""
    pp, m = 2, 4
    comm = dict(forward_comm_s=[0.4] * pp, backward_comm_s=[0.8] * pp)
    small = _costs(pp, 4, **comm)  # pieces of 0.25 / 0.5 s: they fit
    plain = bubble(ScheduleProblem(pp, m, costs=small, encoder_stages=pp, pieces=4))
    filled = bubble(ScheduleProblem(pp, m, costs=small, encoder_stages=pp, pieces=4),
                    tp_bubbles=True)
    inside = [a for r in filled.ranks for a in r if a.in_tp_bubble]
    assert inside and all(a.kind in ("EF", "EB") for a in inside)
    assert "in a TP bubble" in str(inside[0])
    assert Schedule.from_dict(json.loads(json.dumps(filled.to_dict()))) == filled
    t_filled, t_plain = simulate(filled, small), simulate(plain, small)
    assert t_filled.iteration_s < t_plain.iteration_s
    assert sum(t_filled.encoder_busy_s) == pytest.approx(sum(t_plain.encoder_busy_s))
    # a piece's own TP all-reduces share the LLM's links: the rank pays for them
    talking = _costs(pp, 4, encoder_forward_comm_s=[0.01] * 8,
                     encoder_backward_comm_s=[0.02] * 8, **comm)
    t_talking = simulate(filled, talking)
    assert sum(t_talking.busy_s) > sum(t_filled.busy_s)
    assert t_talking.iteration_s >= t_filled.iteration_s
    big = _costs(pp, 1, **comm)  # 1 s / 2 s pieces never fit
    assert not any(a.in_tp_bubble for r in bubble(ScheduleProblem(pp, m, costs=big,
                                                                  encoder_stages=pp, pieces=1),
                                                  tp_bubbles=True).ranks for a in r)
    misplaced = Schedule.from_dict(filled.to_dict())
    first = misplaced.ranks[0][0]  # an encoder forward before any LLM action
    misplaced.ranks[0][0] = Action(first.kind, first.microbatch, first.chunk, True)
    with pytest.raises(PlanError, match="only an encoder action right after an LLM action"):
        validate(misplaced)
