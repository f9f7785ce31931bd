"""The schedule executor of ``--encoder-schedule coarse|bubble``: it runs the schedule the
plan generates (``planning/encoder_schedule.py``) instead of Megatron-Core's schedules."""

from __future__ import annotations

from functools import partial

from ..plan.schedules.encoder_pipeline import EncoderPipelinePlan
from ..runtime import ScheduleExecutor
from .planning.encoder_schedule import make_schedule, plan_costs
from .step import batch_to_device


def build_executor(config, plan: EncoderPipelinePlan, chain, replicas=None,
                   attention=None) -> ScheduleExecutor:
    """``config``: the RunConfig with the plan's encoder schedule; ``replicas``: the
    encoder replicas' groups (an encoder TP below the LLM's); ``attention``: the attention
    settings (with CP, they give each rank's token count)."""
    costs = plan_costs(config, plan, chain)
    executor = ScheduleExecutor(lambda m: make_schedule(config, plan, m, chain), plan.pieces,
                                batch_to_device, replicas, plan.placements,
                                partial(local_length, attention)
                                if config.parallel.context_parallel_size > 1 else None,
                                cost=lambda a: costs.of(a.kind, a.chunk))
    # generated and validated before any step
    executor.schedule(config.training.num_microbatches)
    return executor


def local_length(attention, batch: dict) -> int:
    """This context-parallel rank's token count of ``batch`` (host data): the sequence
    length of the hidden states between LLM chunks."""
    return attention.mask_for(batch).local.shape[0]
