"""``executor_for``: a schedule executor from a plan, a ``ScheduleProblem`` and the model
chunks, with no RunConfig, runs what the training run's ``build_executor`` runs."""

import pytest
from plans import plan_of
from train_workers import TINY_MODEL

from megatron_mm.plan.errors import PlanError
from megatron_mm.plan.schedules.problem import EncoderLayout, ScheduleProblem
from megatron_mm.training.loop.encoder_executor import build_executor, executor_for
from megatron_mm.training.planning.encoder_schedule import schedule_problem

ARGV = TINY_MODEL + ["--micro-batch-size", "1", "--global-batch-size", "4",
                     "--pipeline-model-parallel-size", "2", "--train-iters", "1"]


@pytest.mark.parametrize("schedule", ["coarse", "bubble"])
def test_the_same_schedule_as_the_training_run(digits_dir, schedule):
    config, plan = plan_of(ARGV + ["--data-path", digits_dir, "--encoder-schedule", schedule], 2)
    run = build_executor(config, plan.encoder_plan, plan.chain)
    if schedule == "coarse":  # by hand: the ViT over both ranks, the reductions' starts
        problem = ScheduleProblem(2, 4, layouts=[EncoderLayout(2)], grad_sync=True)
    else:  # the plan's per-action costs
        problem = schedule_problem(config, plan.encoder_plan, 4, plan.chain)
    mine = executor_for(plan.encoder_plan, problem, schedule=schedule)
    for m in (4, 8):  # each micro-batch count: the same problem with it
        assert mine.schedule(m).ranks == run.schedule(m).ranks, m
    assert mine.pieces == run.pieces and mine.placements == run.placements


def test_what_does_not_fit_the_plan_is_refused(digits_dir):
    config, plan = plan_of(ARGV + ["--data-path", digits_dir, "--encoder-schedule", "bubble"], 2)
    enc = plan.encoder_plan
    with pytest.raises(PlanError, match="per-action costs"):
        executor_for(enc, ScheduleProblem(2, 4, layouts=[EncoderLayout(2)]), schedule="bubble")
    with pytest.raises(PlanError, match="colocated schedules.*'separate'"):
        executor_for(enc, ScheduleProblem(2, 4), schedule="separate")
    with pytest.raises(PlanError, match="--pipeline-model-parallel-size 2, the schedule "
                                        "problem for 4"):
        executor_for(enc, ScheduleProblem(4, 4), schedule="coarse")
    with pytest.raises(PlanError, match="2 model chunks.*virtual-pipeline-model-parallel-size "
                                        "1"):
        executor_for(enc, ScheduleProblem(2, 4), model=[object(), object()], schedule="coarse")
    with pytest.raises(PlanError, match="the plan has 1 encoders, the schedule problem 2"):
        executor_for(enc, ScheduleProblem(2, 4, encoders=2), schedule="coarse")
