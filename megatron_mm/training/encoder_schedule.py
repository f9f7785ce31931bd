"""``--encoder-schedule coarse|bubble``: each encoder as its own pipeline, run by the
schedule executor instead of Megatron-Core's schedules (``megatron``, the default).

The plan (LLM partition, encoder pieces and their ranks) comes from the training chain; the
``bubble`` schedule is generated on its per-action costs (``schedule_costs``: the cost
model or measured per-layer times of ``--pipeline-profile``, with the TP traffic of
``plan/unit_costs``, the costs ``--encoder-schedule auto`` chose on), once per micro-batch
count. ``args`` here are the run's flags with the plan's encoder schedule
(``TrainingPlan.run_args``). The schedules name
their collectives (the encoder replicas' broadcast and gradient sum, the data-parallel
reductions' start points) and are validated as they are generated; ``build_executor``
generates the run's schedule up front, so a schedule that cannot run fails at start-up.
"""

from __future__ import annotations

from functools import partial

from ..plan.bubble import bubble
from ..plan.encoder_pipeline import EncoderPipelinePlan, schedule_costs, plan_encoder_pipeline
from ..plan.generate import coarse
from ..plan.partition import parse_partition_flag
from ..runtime import ScheduleExecutor
from .encoder_schedule_auto import hardware, time_inputs
from .pipeline_plan import training_chain
from .step import batch_to_device


def separate_encoder(args) -> bool:
    return getattr(args, "encoder_schedule", "megatron") != "megatron"


def encoder_pipeline_plan(args, chain=None, policy=None) -> EncoderPipelinePlan:
    return plan_encoder_pipeline(
        chain if chain is not None else training_chain(args),
        args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size or 1,
        policy if policy is not None else parse_partition_flag(args.pipeline_partition),
        args.encoder_pipeline_model_parallel_size,
        args.encoder_pieces, args.num_microbatches, hardware(args))


def make_schedule(args, plan: EncoderPipelinePlan, num_microbatches: int, chain=None):
    pp, vpp = args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size or 1
    stages, pieces = args.encoder_pipeline_model_parallel_size, args.encoder_pieces
    encoders = dict(encoders=len(plan.pieces), frozen_encoders=plan.frozen_encoders,
                    encoder_replicas=encoder_replicas(args), grad_sync=True)
    if args.encoder_schedule == "coarse":
        return coarse(pp, vpp, num_microbatches, plan.encoder_trainable, stages, pieces,
                      **encoders)
    costs = schedule_costs(chain if chain is not None else training_chain(args),
                           plan.llm_partition, plan.pieces, hardware(args),
                           encoder_tensor_model_parallel_size=(
                               args.encoder_tensor_model_parallel_size),
                           **time_inputs(args))
    return bubble(pp, vpp, num_microbatches, plan.encoder_trainable, costs, stages, pieces,
                  extra_warmup="auto", **encoders)


def encoder_replicas(args) -> int:
    """Encoder replicas per LLM TP group (TP / encoder TP)."""
    etp = getattr(args, "encoder_tensor_model_parallel_size", None)
    return args.tensor_model_parallel_size // etp if etp else 1


def build_executor(args, plan: EncoderPipelinePlan, chain, replicas=None,
                   attention=None) -> ScheduleExecutor:
    """``replicas``: the encoder replicas' groups (an encoder TP below the LLM's);
    ``attention``: the attention settings (with CP, they give each rank's token count)."""
    executor = ScheduleExecutor(lambda m: make_schedule(args, plan, m, chain), plan.pieces,
                                batch_to_device, replicas, plan.placements,
                                partial(local_length, attention)
                                if args.context_parallel_size > 1 else None)
    executor.schedule(args.num_microbatches)  # generated and validated before any step
    return executor


def local_length(attention, batch: dict) -> int:
    """This context-parallel rank's token count of ``batch`` (host data): the sequence
    length of the hidden states between LLM chunks."""
    return attention.mask_for(batch).local.shape[0]
