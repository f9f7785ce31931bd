"""The schedule executor of ``--encoder-schedule coarse|bubble``: it runs the schedule the
plan generates (``planning/encoder_schedule.py``) instead of Megatron-Core's schedules.

``executor_for`` builds one from a plan, a ``ScheduleProblem`` and the model chunks alone
(no RunConfig: what a script with its own arguments, e.g. Megatron-LM's ``pretrain``, has);
``build_executor`` is the training run's, from its RunConfig.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Callable, Optional, Sequence

from ...plan.errors import PlanError
from ...plan.schedules.by_name import COLOCATED, encoder_schedule
from ...plan.schedules.encoder_pipeline import EncoderPipelinePlan
from ...plan.schedules.problem import ScheduleProblem
from ...runtime import ScheduleExecutor
from ..planning.encoder_schedule import plan_expert_chunks, schedule_problem
from ..assembly.attention import local_length
from ..assembly.initialize import batch_to_device


def executor_for(plan: EncoderPipelinePlan, problem: ScheduleProblem, model: Sequence = (),
                 schedule: str = "bubble", expert_chunks: Sequence[int] = (), *,
                 replicas=None, local_length: Optional[Callable[[dict], int]] = None
                 ) -> ScheduleExecutor:
    """The executor of the ``schedule`` schedule (``coarse`` or ``bubble``) of ``problem``
    (its ``num_microbatches`` the first iteration's; each other count is the same problem
    with that count) over ``plan``'s encoder pieces and chunk placements; ``model``: the
    model chunks it will run (checked against the problem: one per virtual stage);
    ``expert_chunks``: the LLM chunks with MoE layers; ``replicas``: this rank's encoder
    replica (``runtime.EncoderReplicas``, an encoder TP below the LLM's); ``local_length``:
    a context-parallel rank's token count of a batch (None: no CP). The schedule is
    generated and validated here, before any step."""
    if schedule not in COLOCATED:
        raise PlanError(f"executor_for runs the colocated schedules {list(COLOCATED)}; got "
                        f"{schedule!r} (the separate placement: training.separate_run)")
    if model and len(model) != problem.vpp:
        raise PlanError(f"{len(model)} model chunks for a schedule of "
                        f"--virtual-pipeline-model-parallel-size {problem.vpp}: one per "
                        "virtual stage")
    if plan.llm_partition.pipeline_model_parallel_size != problem.pp:
        raise PlanError(f"the plan is for --pipeline-model-parallel-size "
                        f"{plan.llm_partition.pipeline_model_parallel_size}, the schedule "
                        f"problem for {problem.pp}")
    if len(plan.pieces) != len(problem.encoder_layouts()):
        raise PlanError(f"the plan has {len(plan.pieces)} encoders, the schedule problem "
                        f"{len(problem.encoder_layouts())}")
    costs = problem.costs
    executor = ScheduleExecutor(
        lambda m: encoder_schedule(schedule, replace(problem, num_microbatches=m),
                                   expert_chunks),
        plan.pieces, batch_to_device, replicas, plan.placements, local_length,
        cost=None if costs is None else (lambda a: costs.of(a.kind, a.chunk)))
    executor.schedule(problem.num_microbatches)  # generated and validated before any step
    return executor


def build_executor(config, plan: EncoderPipelinePlan, chain, replicas=None,
                   attention=None) -> ScheduleExecutor:
    """``config``: the RunConfig with the plan's encoder schedule; ``replicas``: the
    encoder replicas' groups (an encoder TP below the LLM's); ``attention``: the attention
    settings (with CP, they give each rank's token count)."""
    problem = schedule_problem(config, plan, config.training.num_microbatches, chain)
    return executor_for(plan, problem, (), config.encoder_schedule.encoder_schedule,
                        plan_expert_chunks(plan, chain), replicas=replicas,
                        local_length=partial(local_length, attention)
                        if config.parallel.context_parallel_size > 1 else None)

