"""The dataflow schedule: valid, within its memory bounds, and it packs encoder work into
what 1F1B leaves idle."""

import pytest

from megatron_mm.plan import PlanError
from megatron_mm.plan.schedules.problem import ScheduleProblem
from megatron_mm.plan.schedules.actions import Kind, validate
from megatron_mm.plan.schedules.bubble import bubble
from megatron_mm.plan.schedules.dataflow import dataflow
from megatron_mm.plan.schedules.simulate import ActionCosts, simulate


def _costs():
    """PP=2: LLM chunks forward 1, backward 2; the encoder in 2 pieces, 0.5 / 1 each."""
    return ActionCosts([1.0, 1.0], [2.0, 2.0], [0.5, 0.5], [1.0, 1.0], p2p_s=0.0)


def _peak(sim, first, last):
    """Most micro-batches between the start of their ``first`` action and the end of their
    ``last`` one, over the simulated timeline."""
    events = []
    for t in sim.timeline:
        if (t.kind, t.chunk) == first:
            events.append((t.start_s, 1))
        elif (t.kind, t.chunk) == last:
            events.append((t.end_s, -1))
    peak = held = 0
    for _, step in sorted(events):  # an end before a start at the same moment
        held += step
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("in_flight", [1, 2, 3])
def test_valid_and_within_its_memory_bounds(in_flight):
    costs = _costs()
    s = dataflow(ScheduleProblem(2, 6, costs=costs, encoder_stages=2, pieces=1, reverse=True,
                                 grad_sync=True), max_in_flight=in_flight, max_encoder_ahead=1)
    validate(s)
    sim = simulate(s, costs)
    assert _peak(sim, (Kind.F, 0), (Kind.B, 0)) <= in_flight
    # encoder started (first piece: on rank 1 when reversed), F(m, 0) not yet
    assert _peak(sim, (Kind.EF, 0), (Kind.F, 0)) <= 2  # one waiting + the one in F
    assert sorted(a.kind for a in s.ranks[0]).count(Kind.GRAD_SYNC) == 1


def test_fills_the_warm_up_and_cool_down():
    """Each rank has 6 x (1 + 2 + 0.5 + 1) = 27 s of work. With the encoder placed from the
    last rank, rank 0 waits for one piece forward (0.5) before anything of its own can run,
    and rank 1 runs one piece backward (1) after rank 0's last action: 28.5 s is the least
    possible, and with 3 micro-batches in flight the dataflow order reaches it; the fixed
    1F1B order of the bubble schedule does worse."""
    costs = _costs()
    sim = simulate(dataflow(ScheduleProblem(2, 6, costs=costs, encoder_stages=2, pieces=1,
                                            reverse=True), max_in_flight=3), costs)
    assert sim.iteration_s == pytest.approx(27 + 0.5 + 1.0)
    fixed = min(simulate(bubble(ScheduleProblem(2, 6, costs=costs, encoder_stages=2, pieces=1,
                                                reverse=r), extra_warmup=e),
                         costs).iteration_s for r in (False, True) for e in (0, 1, 2))
    assert sim.iteration_s < fixed


def test_frozen_and_several_encoders():
    costs = ActionCosts([1.0, 1.0], [2.0, 2.0], [0.5, 0.5, 0.3, 0.3], [1.0, 1.0, 0.6, 0.6])
    s = dataflow(ScheduleProblem(2, 4, costs=costs, encoder_stages=2, pieces=1, encoders=2,
                                 frozen_encoders=[1]))
    validate(s)
    kinds = [(a.kind, a.chunk) for r in s.ranks for a in r]
    assert (Kind.EB, 2) not in kinds and (Kind.EB, 3) not in kinds  # audio frozen
    assert kinds.count((Kind.EB, 0)) == 4 and kinds.count((Kind.EF, 3)) == 4


def test_needs_room_for_a_micro_batch():
    with pytest.raises(PlanError, match="max_in_flight"):
        dataflow(ScheduleProblem(2, 4, costs=_costs(), encoder_stages=2, pieces=1),
                 max_in_flight=-1)


def test_longest_chain_first_starts_the_last_backward_of_an_interleaved_encoder_sooner():
    # PP=2, the encoder interleaved from the last rank: ranges [1, 3, 5, 3] on ranks
    # [1, 0, 1, 0] (the heavy bench's cut), backward twice the forward; per rank 120 of work
    from megatron_mm.plan.schedules.generate import EncoderLayout

    costs = ActionCosts([4.0, 4.0], [8.0, 8.0], [1.0, 3.0, 5.0, 3.0], [2.0, 6.0, 10.0, 6.0],
                        p2p_s=0.0)
    layouts = [EncoderLayout(2, 1, True, 2)]

    def best(chain):
        return min(simulate(dataflow(ScheduleProblem(2, 4, costs=costs, layouts=layouts),
                                     max_in_flight=f, max_encoder_ahead=a,
                                     longest_chain_first=chain),
                            costs, timeline=False).iteration_s
                   for f in (2, 3, 4) for a in (2, 4))

    # the last micro-batch's backward passes rank to rank piece by piece: started first,
    # the earlier micro-batches' pieces fill its waits
    assert best(False) == 127.0 and best(True) == 123.0
    s = dataflow(ScheduleProblem(2, 4, costs=costs, layouts=layouts),
                 max_in_flight=3, max_encoder_ahead=4, longest_chain_first=True)
    validate(s)
    assert s.encoder_ranks == [1, 0, 1, 0]
