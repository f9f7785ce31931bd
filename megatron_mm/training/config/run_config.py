"""The run's configuration, typed: the validated flags in frozen groups (``groups/``: one
dataclass per concern, written out), as Megatron-LM groups its own configs, with what
validation derives from them.

A group's fields are the parser's dests (Megatron-LM's attribute names: code that reads
``.seq_length`` reads it from the model group); the encoder families' own flags are the
model group's ``families``. No torch import.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Dict, List, Optional

from ...config import ConfigError, MultimodalModelConfig
from ...plan.fp8 import Fp8Settings
from .groups import (GROUP_CLASSES, GROUPS, CheckpointArgs, DataArgs, EncoderScheduleArgs,
                     ExitsArgs, Fp8Args, FusionArgs, LoggingArgs, ModelArgs, MoeArgs,
                     ParallelArgs, PipelineArgs, RecomputeArgs, TrainingArgs, ValidationArgs,
                     from_values, to_values)


def group_of_flags(group: str, args):
    """One group of a namespace of flags (validation builds the model config from the
    model group)."""
    return from_values(GROUP_CLASSES[group], vars(args))


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The run's groups of flags, its model config (without the tokenizer's vocabulary)
    and FP8 settings (None without ``--fp8-format``)."""

    model: ModelArgs
    parallel: ParallelArgs
    pipeline: PipelineArgs
    encoder_schedule: EncoderScheduleArgs
    recompute: RecomputeArgs
    training: TrainingArgs
    checkpoint: CheckpointArgs
    data: DataArgs
    validation: ValidationArgs
    logging: LoggingArgs
    exits: ExitsArgs
    fp8: Fp8Args
    fusion: FusionArgs
    moe: MoeArgs
    model_config: Optional[MultimodalModelConfig] = None
    fp8_settings: Optional[Fp8Settings] = None

    @classmethod
    def from_flags(cls, args) -> "RunConfig":
        """The groups of a validated namespace (or of one read back from a checkpoint)."""
        groups = {group: group_of_flags(group, args) for group in GROUPS}
        return cls(**groups, model_config=getattr(args, "model_config", None),
                   fp8_settings=getattr(args, "fp8_settings", None))

    def flags(self) -> Dict[str, Any]:
        """Every group's fields in one dict: what checkpoints save (Megatron-LM's names)."""
        out: Dict[str, Any] = {}
        for group in GROUPS:
            out.update(to_values(getattr(self, group)))
        return out

    def errors(self, world_size: Optional[int] = None) -> List[ConfigError]:
        """What is wrong with this configuration for ``world_size`` ranks (default
        ``$WORLD_SIZE``), each error naming its flag: every group's own errors, else the
        first of the checks across groups (they read what validation derives)."""
        from .validation import derive, group_errors

        errors = group_errors(self)
        if errors:
            return errors
        try:
            derive(self, world_size)
        except ConfigError as e:
            return [e]
        return []

    def validated(self, world_size: Optional[int] = None) -> "RunConfig":
        """This configuration checked for ``world_size`` ranks (default ``$WORLD_SIZE``): a
        new RunConfig with what validation derives (the world's sizes, the micro-batches per
        step, the flags' dependent defaults, ``model_config``, ``fp8_settings``); a
        ConfigError names the first bad flag. ``self`` is not changed."""
        from .validation import validated

        return validated(self, world_size)

    @property
    def encoder_replicas(self) -> int:
        """Encoder replicas per LLM TP group (TP / encoder TP)."""
        etp = self.encoder_schedule.encoder_tensor_model_parallel_size
        return self.parallel.tensor_model_parallel_size // etp if etp else 1

    def namespace(self) -> argparse.Namespace:
        """A fresh namespace of these flags, for the namespace entry points (Megatron-LM's
        args); the run reads the groups."""
        return argparse.Namespace(**self.flags(), model_config=self.model_config,
                                  fp8_settings=self.fp8_settings)


