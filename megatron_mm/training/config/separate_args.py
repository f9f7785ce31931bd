"""``--encoder-schedule separate``: the flags of the separate (non-colocated) placement,
checked up front (``plan/schedules/separate.py`` plans and simulates the placement).

The world's first ``--encoder-tensor-model-parallel-size`` x ``--encoder-data-parallel-size``
ranks hold the encoders, the rest the LLM with its usual TP / PP / CP and the data-parallel
size they leave. What the training run does not cover yet is refused naming the flag:
one clear error, never a silent fallback to a colocated schedule."""

from __future__ import annotations

import dataclasses

from ...config import ConfigError
from ...families import SLOTS
from ...plan.errors import PlanError
from ...plan.schedules.separate import placement_sizes


def validate_separate_sizes(config, world_size: int):
    """``config`` (the RunConfig) with the encoder sizes' defaults (1 and 1; with
    ``--{encoder}-encoder-data-parallel-size`` each of the model's encoders 1 replica of its
    own), and the LLM's ranks (the world less the encoder ranks); or a ``ConfigError``
    naming the flag when they do not divide."""
    own = own_encoder_slots(config)
    defaults = {}
    flags = ["encoder_tensor_model_parallel_size"] + (
        [] if own else ["encoder_data_parallel_size"])
    for flag in flags + [f"{slot}_encoder_data_parallel_size" for slot in own]:
        if getattr(config.encoder_schedule, flag) is None:
            defaults[flag] = 1
    config = dataclasses.replace(config, encoder_schedule=dataclasses.replace(
        config.encoder_schedule, **defaults))
    for flag in ("encoder_pipeline_model_parallel_size",
                 "encoder_virtual_pipeline_model_parallel_size"):
        if getattr(config.encoder_schedule, flag) is not None:
            raise ConfigError(f"--{flag.replace('_', '-')} does not apply to --encoder-schedule"
                              " separate (each encoder runs whole on an encoder replica)")
    try:
        par = config.parallel
        sizes = placement_sizes(world_size, par.tensor_model_parallel_size,
                                par.pipeline_model_parallel_size, par.context_parallel_size,
                                config.encoder_schedule.encoder_tensor_model_parallel_size,
                                config.encoder_schedule.encoder_data_parallel_size or 1,
                                own_encoder_sizes(config), own)
    except PlanError as e:
        raise ConfigError(str(e)) from None
    return config, world_size - sizes.encoder_ranks


def own_encoder_slots(config) -> list:
    """The model's encoders, in chain order, when each is on replicas of its own (some
    ``--{encoder}-encoder-data-parallel-size`` given); else none."""
    named = [slot for slot in SLOTS
             if getattr(config.encoder_schedule, f"{slot}_encoder_data_parallel_size") is not None]
    if not named:
        return []
    flag = f"--{named[0]}-encoder-data-parallel-size"
    if config.encoder_schedule.encoder_data_parallel_size is not None:
        raise ConfigError(f"{flag} puts each encoder on replicas of its own, "
                          "--encoder-data-parallel-size all encoders on shared ones: pass one "
                          "of them")
    present = [slot for slot in SLOTS if getattr(config.model, f"{slot}_model_type") != "none"]
    for slot in named:
        if slot not in present:
            raise ConfigError(f"--{slot}-encoder-data-parallel-size: the model has no {slot} "
                              f"encoder (--{slot}-model-type none)")
    return present


def own_encoder_sizes(config) -> list:
    """Each encoder's replicas when each has its own (``own_encoder_slots``), else []."""
    return [getattr(config.encoder_schedule, f"{slot}_encoder_data_parallel_size") or 1
            for slot in own_encoder_slots(config)]


def validate_separate(config) -> None:
    """The run within what it covers."""
    if not config.model_config.encoders:
        raise ConfigError("--encoder-schedule separate needs an encoder (--vision-model-type "
                          "or --audio-model-type)")
    # What the training run covers so far (what is tested through it): one clear error
    # naming the flag for the rest.
    if config.pipeline.pipeline_partition == "search":
        raise ConfigError("--encoder-schedule separate does not run --pipeline-partition "
                          "search (its trials run Megatron-Core's schedules)")
