"""``--encoder-schedule coarse|bubble``: each encoder as its own pipeline, run by the
schedule executor instead of Megatron-Core's schedules (``megatron``, the default).

The plan (LLM partition, encoder pieces and their ranks) comes from the training chain; the
``bubble`` schedule is generated on its per-action costs (``schedule_costs``: the cost
model or measured per-layer times of ``--pipeline-profile``, with the TP traffic of
``plan/unit_costs``, the costs ``--encoder-schedule auto`` chose on), once per micro-batch
count. ``config`` here is the run's RunConfig with the plan's encoder schedule
(``TrainingPlan.run_config``). The schedules name
their collectives (the encoder replicas' broadcast and gradient sum, the data-parallel
reductions' start points) and are validated as they are generated; the run's executor
(``training/encoder_executor.py``) generates its schedule up front, so a schedule that
cannot run fails at start-up.
"""

from __future__ import annotations

from ...plan.schedules.by_name import encoder_schedule
from ...plan.schedules.encoder_pipeline import (EncoderPipelinePlan, expert_chunks,
                                                plan_encoder_pipeline, schedule_costs,
                                                segment_cuts, split_chain)
from ...plan.errors import PlanError
from ...plan.schedules.generate import EncoderLayout, ScheduleProblem
from ...plan.pipeline.partition import parse_partition_flag
from ...plan.schedules.simulate import simulate
from .chain import training_chain
from .time_inputs import hardware, time_inputs


def separate_encoder(encoder_schedule) -> bool:
    return encoder_schedule.encoder_schedule != "megatron"


def encoder_pipeline_plan(config, chain=None, policy=None) -> EncoderPipelinePlan:
    """The plan for the flags (``config``: the RunConfig). For the bubble schedule on a
    balanced partition (not ``uniform`` or explicit counts) the encoder's stage boundaries
    are searched by simulation: the balanced cut and each boundary one layer either side
    (what balances ranks' totals need not pack the bubbles best); an interleaved encoder
    (``--encoder-virtual-pipeline-model-parallel-size``) tries every cut of its layers into
    its segments where they are few (``encoder_pipeline.segment_cuts``: a short first
    segment starts the pipeline sooner and ends its backward sooner, which no balance
    sees), from each end of the pipeline that ``--encoder-placement`` allows (auto: both;
    coarse: the first)."""
    parallel, schedule = config.parallel, config.encoder_schedule
    m = config.training.num_microbatches
    chain = chain if chain is not None else training_chain(config)
    policy = (policy if policy is not None
              else parse_partition_flag(config.pipeline.pipeline_partition))
    placement = schedule.encoder_placement
    bubble_search = schedule.encoder_schedule == "bubble"
    if placement == "auto":
        placement = "auto" if bubble_search else "first"
    stages = (schedule.encoder_pipeline_model_parallel_size
              or parallel.pipeline_model_parallel_size)
    virtual = encoder_virtual_stages(config)
    pieces = schedule.encoder_pieces
    searched = bubble_search and isinstance(policy, str) and policy != "uniform"
    segments = virtual * stages
    shifts = [()]
    if searched:
        shifts += [tuple(d if i == b else 0 for i in range(segments - 1))
                   for b in range(segments - 1) for d in (-1, 1)]
    cuts = (segment_cuts(_encoder_layers(chain), segments, pieces)
            if searched and virtual > 1 else [])
    trials = [(shift, ()) for shift in shifts] + [((), cut) for cut in cuts]
    plans = []
    for reverse in {"first": [False], "last": [True], "auto": [False, True]}[placement]:
        for shift, cut in trials:
            try:
                plans.append(plan_encoder_pipeline(
                    chain, parallel.pipeline_model_parallel_size,
                    parallel.virtual_pipeline_model_parallel_size or 1, policy, stages,
                    pieces, m, hardware(config.pipeline), reverse=reverse, shift=shift,
                    virtual=virtual, segments=cut))
            except PlanError:
                if not shift and not cut:  # the balanced cut itself: the flags' error
                    raise
    if len(plans) == 1:
        return plans[0]

    def iteration_s(plan, quick=False) -> float:
        return simulate(make_schedule(config, plan, m, chain, quick),
                        plan_costs(config, plan, chain), timeline=False).iteration_s

    if len(plans) > FULL_TRIALS:  # many cuts: the quick schedules pick whom to try fully
        plans = sorted(plans, key=lambda plan: iteration_s(plan, True))[:FULL_TRIALS]
    # the first of equals: the balanced cut, the usual placement
    return min(plans, key=iteration_s)


# More candidate plans than this: each ranked on the bubble generator's two quickest
# orders first, the best this many planned in full.
FULL_TRIALS = 12


def _encoder_layers(chain) -> int:
    """The first encoder's transformer layers (the one the segment search cuts)."""
    name, layers = split_chain(chain)[0][0]
    return sum(1 for l in layers if l.kind.endswith("_layer"))


def encoder_virtual_stages(config) -> int:
    """``--encoder-virtual-pipeline-model-parallel-size`` (1: not interleaved)."""
    return config.encoder_schedule.encoder_virtual_pipeline_model_parallel_size or 1


def plan_costs(config, plan: EncoderPipelinePlan, chain=None):
    """Per-action costs of the plan's LLM chunks and encoder pieces (with the encoder
    TP's traffic: ``time_inputs``)."""
    return schedule_costs(chain if chain is not None else training_chain(config),
                          plan.llm_partition, plan.pieces, hardware(config.pipeline),
                          encoder_tensor_model_parallel_size=(
                              config.encoder_schedule.encoder_tensor_model_parallel_size),
                          **time_inputs(config))


def make_schedule(config, plan: EncoderPipelinePlan, num_microbatches: int, chain=None,
                  quick: bool = False):
    """The run's coarse or bubble schedule, its expert all-to-alls (an MoE LLM at expert
    parallelism) as actions after the LLM actions that run them. ``quick``: the bubble
    generator's two quickest orders only (``bubble(extra_warmup="quick")``), to rank plans."""
    chain = chain if chain is not None else training_chain(config)
    return encoder_schedule(config.encoder_schedule.encoder_schedule,
                            schedule_problem(config, plan, num_microbatches, chain),
                            plan_expert_chunks(plan, chain), quick)


def plan_expert_chunks(plan: EncoderPipelinePlan, chain):
    """The plan's LLM chunks holding MoE layers (their F / B run expert all-to-alls)."""
    llm = split_chain(chain)[1]
    return expert_chunks([llm[s:e] for s, e in plan.llm_partition.chunk_bounds()])


def schedule_problem(config, plan: EncoderPipelinePlan, num_microbatches: int, chain=None
                     ) -> ScheduleProblem:
    """The run's schedule problem: the plan's encoders on the flags' layout, the encoder
    replicas, the data-parallel reductions' start points, the plan's per-action costs."""
    parallel, schedule = config.parallel, config.encoder_schedule
    pp = parallel.pipeline_model_parallel_size
    stages = schedule.encoder_pipeline_model_parallel_size or pp
    layouts = [EncoderLayout(stages, schedule.encoder_pieces, plan.reverse,
                             encoder_virtual_stages(config))] * len(plan.pieces)
    return ScheduleProblem(
        pp, num_microbatches,
        virtual_pipeline_model_parallel_size=parallel.virtual_pipeline_model_parallel_size or 1,
        encoder_trainable=plan.encoder_trainable, layouts=layouts,
        frozen_encoders=plan.frozen_encoders, encoder_replicas=config.encoder_replicas,
        grad_sync=True, costs=plan_costs(config, plan, chain))
