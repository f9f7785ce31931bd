"""One typed schedule problem for every generator: it round-trips as a plan record, and
each generator refuses what is not its problem with an error naming the field."""

import pytest

from megatron_mm.plan.errors import PlanError
from megatron_mm.plan.schedules.bubble import bubble
from megatron_mm.plan.schedules.by_name import encoder_schedule
from megatron_mm.plan.schedules.dataflow import dataflow
from megatron_mm.plan.schedules.generate import coarse
from megatron_mm.plan.schedules.problem import EncoderLayout, ScheduleProblem
from megatron_mm.plan.schedules.separate import separate
from megatron_mm.plan.schedules.simulate import ActionCosts

COSTS = ActionCosts([1.0, 1.0], [2.0, 2.0], [0.5, 0.5], [1.0, 1.0])


def test_round_trips_and_gives_each_encoder_its_layout():
    p = ScheduleProblem(2, 4, costs=COSTS, encoders=2, pieces=2, reverse=True,
                        frozen_encoders=[1], encoder_replicas=2, grad_sync=True)
    assert ScheduleProblem.from_json(p.to_json()) == p
    assert p.encoder_layouts() == [EncoderLayout(2, 2, True)] * 2
    own = ScheduleProblem(4, 4, layouts=[EncoderLayout(2), EncoderLayout(1, 2)])
    assert own.encoder_layouts() == own.layouts
    with pytest.raises(TypeError):  # only PP and the micro-batches are positional
        ScheduleProblem(2, 4, 1)


def test_each_generator_refuses_what_is_not_its_problem():
    for generate in (bubble, dataflow):
        with pytest.raises(PlanError, match="needs per-action costs"):
            generate(ScheduleProblem(2, 4))
    with pytest.raises(PlanError, match="llm_data_parallel_size.*separate placement"):
        coarse(ScheduleProblem(2, 4, llm_data_parallel_size=2))
    with pytest.raises(PlanError, match="layouts, encoder_stages, pieces.*colocated"):
        separate(ScheduleProblem(2, 4, pieces=2))
    with pytest.raises(PlanError, match="expected one of \\['coarse', 'bubble'\\]"):
        encoder_schedule("separate", ScheduleProblem(2, 4))
    # by name: the generator's own schedule, the bubble one on its folded costs
    assert encoder_schedule("coarse", ScheduleProblem(2, 4)).ranks == \
        coarse(ScheduleProblem(2, 4)).ranks
    assert encoder_schedule("bubble", ScheduleProblem(2, 4, costs=COSTS)).ranks == \
        bubble(ScheduleProblem(2, 4, costs=COSTS), extra_warmup="auto").ranks
