"""An invalid schedule is refused before any rank runs it: the executor validates the
schedule it is handed (and that it is for this run's encoder replicas and micro-batches)
before it takes a batch or runs an action."""

from types import SimpleNamespace

import pytest

from megatron_mm.plan import PlanError
from megatron_mm.plan.schedules.problem import ScheduleProblem
from megatron_mm.plan.schedules.actions import Action, Schedule
from megatron_mm.plan.schedules.generate import coarse, megatron
from megatron_mm.runtime.executor import ScheduleExecutor


def _deadlocked(m):
    schedule = megatron(2, 1, m)
    broken = Schedule.from_dict(schedule.to_dict())  # rank 1: its backward first
    broken.ranks[1] = [Action("B", 0, 1), Action("F", 0, 1)] + broken.ranks[1][2:]
    return broken


def _call(executor, m):
    ran = []

    def batches():
        while True:
            ran.append("batch")
            yield {}

    def forward_step(*_):
        ran.append("forward")

    with pytest.raises(PlanError) as error:
        executor(forward_step_func=forward_step, data_iterator=batches(), model=[None],
                 num_microbatches=m)
    assert ran == []  # nothing taken, nothing run
    return str(error.value)


def test_a_deadlocking_schedule_is_refused_before_any_action():
    executor = ScheduleExecutor(_deadlocked, [], to_device=lambda b: b)
    assert "rank 1 waits in B(micro-batch 0, chunk 1)" in _call(executor, 4)


def test_a_schedule_for_other_replicas_or_micro_batches_is_refused():
    replicas = ScheduleExecutor(lambda m: coarse(ScheduleProblem(2, m, encoder_stages=2)), [],
                                to_device=lambda b: b, replicas=SimpleNamespace(replicas=2))
    assert "for 1 encoder replicas per TP group; this run has 2" in _call(replicas, 4)
    stale = ScheduleExecutor(lambda m: megatron(2, 1, 8), [], to_device=lambda b: b)
    assert "has 8 micro-batches; the iteration has 4" in _call(stale, 4)


def test_a_schedule_reducing_encoder_pieces_on_their_own_is_refused():
    """The runtime keeps the pieces in the first model chunk's gradient buffers: a
    schedule that says they reduce on their own would not be what runs."""
    own = ScheduleExecutor(lambda m: coarse(ScheduleProblem(2, m, encoder_stages=2, grad_sync=True,
                                                            encoder_grad_sync=True)),
                           [], to_device=lambda b: b)
    assert "reduces the encoder pieces on their own (ENCODER_GRAD_SYNC)" in _call(own, 4)


def test_a_schedule_with_encoder_work_in_tp_bubbles_is_refused():
    from megatron_mm.plan.schedules.bubble import bubble
    from megatron_mm.plan.schedules.simulate import ActionCosts

    costs = ActionCosts([1.0] * 2, [2.0] * 2, [0.25] * 8, [0.5] * 8, forward_comm_s=[0.4] * 2,
                        backward_comm_s=[0.8] * 2)
    filled = ScheduleExecutor(lambda m: bubble(ScheduleProblem(2, m, costs=costs, encoder_stages=2,
                                                               pieces=4), tp_bubbles=True),
                              [], to_device=lambda b: b)
    assert "inside TP communication (in_tp_bubble)" in _call(filled, 4)
