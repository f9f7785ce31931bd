"""``--encoder-schedule separate``: the flags of the separate (non-colocated) placement,
checked up front (``plan/schedules/separate.py`` plans and simulates the placement).

The world's first ``--encoder-tensor-model-parallel-size`` x ``--encoder-data-parallel-size``
ranks hold the encoders, the rest the LLM with its usual TP / PP / CP and the data-parallel
size they leave. What cannot be sent between the two yet (DeepStack features) is refused
naming the flag, and so is the placement itself until the training runtime runs its
program: one clear error, never a silent fallback to a colocated schedule."""

from __future__ import annotations

import argparse

from ..config import ConfigError
from ..plan.errors import PlanError
from ..plan.schedules.separate import placement_sizes


def validate_separate_sizes(args: argparse.Namespace, world_size: int) -> int:
    """Sets the encoder sizes' defaults (1 and 1); returns the LLM's ranks (the world less
    the encoder ranks), or a ``ConfigError`` naming the flag when they do not divide."""
    for flag in ("encoder_tensor_model_parallel_size", "encoder_data_parallel_size"):
        if getattr(args, flag) is None:
            setattr(args, flag, 1)
    for flag in ("encoder_pipeline_model_parallel_size",):
        if getattr(args, flag) is not None:
            raise ConfigError(f"--{flag.replace('_', '-')} does not apply to --encoder-schedule"
                              " separate (each encoder runs whole on an encoder replica)")
    try:
        sizes = placement_sizes(world_size, args.tensor_model_parallel_size,
                                args.pipeline_model_parallel_size, args.context_parallel_size,
                                args.encoder_tensor_model_parallel_size,
                                args.encoder_data_parallel_size)
    except PlanError as e:
        raise ConfigError(str(e)) from None
    return world_size - sizes.encoder_ranks


def validate_separate(args: argparse.Namespace) -> None:
    """What the encoders hand the LLM must be sendable; then the runtime's refusal."""
    for name, enc in args.model_config.encoders.items():
        if getattr(enc, "deepstack_llm_layers", 0):
            raise ConfigError(
                f"--encoder-schedule separate: the {name} encoder "
                f"({enc.model_type}) hands LLM layers DeepStack features, which the separate "
                "placement does not send yet; use --encoder-schedule megatron")
    if not args.model_config.encoders:
        raise ConfigError("--encoder-schedule separate needs an encoder (--vision-model-type "
                          "or --audio-model-type)")
    raise ConfigError("--encoder-schedule separate is planned and simulated "
                      "(tools/simulate_schedule.py --encoder-data-parallel-size N) but the "
                      "training runtime does not run it yet; use --encoder-schedule "
                      "megatron, coarse or bubble")
