"""``--encoder-schedule separate``: which of the world's ranks hold the encoders and which
the LLM (``runtime/separate_placement.py``'s ``SeparateRanks`` for the run's flags)."""

from __future__ import annotations

import dataclasses

import torch.distributed as dist

from ...config import ConfigError
from ...families import SLOTS
from ...plan.errors import PlanError
from ...plan.schedules.separate import expert_replicas, placement_sizes
from ...runtime.separate_placement import SeparateRanks


def separate_ranks(parallel, encoder_schedule, world_size: int) -> SeparateRanks:
    """The world's ranks of the placement (``parallel``, ``encoder_schedule``: the
    RunConfig's groups); a size the program does not cover yet: a ConfigError."""
    own = own_encoders(encoder_schedule)
    try:
        return SeparateRanks(
            placement_sizes(world_size, parallel.tensor_model_parallel_size,
                            parallel.pipeline_model_parallel_size,
                            parallel.context_parallel_size,
                            encoder_schedule.encoder_tensor_model_parallel_size or 1,
                            encoder_schedule.encoder_data_parallel_size or 1,
                            list(own.values()), list(own)),
            parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size,
            parallel.context_parallel_size,
            parallel.expert_model_parallel_size, parallel.expert_tensor_parallel_size)
    except PlanError as e:
        prefix = "--encoder-schedule separate: "
        raise ConfigError(("" if str(e).startswith(prefix) else prefix) + str(e)) from None


def own_encoders(encoder_schedule) -> dict:
    """{encoder: its replicas} in chain order when each encoder is on replicas of its own
    (validation gave each of the model's encoders its ``--{encoder}-encoder-data-parallel-
    size``), else {}."""
    return {slot: n for slot in SLOTS
            if (n := getattr(encoder_schedule, f"{slot}_encoder_data_parallel_size"))
            is not None}


def world_ranks(config) -> SeparateRanks:
    """This run's placement, in the running world."""
    return dataclasses.replace(
        separate_ranks(config.parallel, config.encoder_schedule, dist.get_world_size()),
        lockstep_replicas=llm_lockstep_replicas(config))


def llm_lockstep_replicas(config) -> int:
    """The LLM replicas whose stages meet in collectives inside their actions, which the
    program keeps in step (``config``: the RunConfig): all of them when FP8's delayed
    scaling reduces an LLM-side module's amaxes (the LLM's or a projector's) over the
    data-parallel ranks (Megatron-Core's amax group, TP x DP x CP unless
    ``--tp-only-amax-red``) at every autocast exit and backward; else an MoE LLM's
    expert groups' (``expert_replicas``); 1 for neither."""
    parallel, fp8 = config.parallel, config.fp8_settings
    if (fp8 is not None and fp8.recipe == "delayed" and not fp8.tp_only_amax_red
            and any(m == "llm" or m.endswith("-projector") for m in fp8.modules)):
        return parallel.data_parallel_size  # the LLM's: its ranks are the parallel world
    return expert_replicas(parallel.tensor_model_parallel_size,
                           parallel.context_parallel_size,
                           parallel.expert_model_parallel_size,
                           parallel.expert_tensor_parallel_size)


def on_encoder_rank(config) -> bool:
    return world_ranks(config).is_encoder(dist.get_rank())
