"""The run's typed groups of flags, written out: one frozen dataclass per concern, each field
a flag (Megatron-LM's name as the attribute; its type and default; its docstring the
``--help`` text; ``argparse_meta`` where argparse needs more). The parser is made from them
with Megatron-LM's ``ArgumentGroupFactory`` (``arguments.build_parser``). No torch import."""

from .checkpoint import CheckpointArgs
from .data import DataArgs
from .encoder_schedule import EncoderScheduleArgs
from .exits import ExitsArgs
from .fields import DERIVED, derived_names, flag_fields, from_values, to_values
from .fp8 import Fp8Args
from .fusion import FusionArgs
from .logging import LoggingArgs
from .model import (AudioEncoderArgs, FreezingArgs, LanguageModelArgs, ModelArgs,
                    VisionEncoderArgs)
from .moe import MoeArgs
from .parallel import ParallelArgs
from .pipeline import PipelineArgs
from .recompute import RecomputeArgs
from .training import TrainingArgs
from .validation import ValidationArgs

# RunConfig's groups, in its order: its field name -> the group's class
GROUP_CLASSES = {
    "model": ModelArgs, "parallel": ParallelArgs, "pipeline": PipelineArgs,
    "encoder_schedule": EncoderScheduleArgs, "recompute": RecomputeArgs,
    "training": TrainingArgs, "checkpoint": CheckpointArgs, "data": DataArgs,
    "validation": ValidationArgs, "logging": LoggingArgs, "exits": ExitsArgs,
    "fp8": Fp8Args, "fusion": FusionArgs, "moe": MoeArgs,
}
GROUPS = tuple(GROUP_CLASSES)
# The --help sections in order: the model group's four, then one per other group; the
# encoder families' own flags follow the vision and audio sections (arguments.py).
SECTIONS = ((LanguageModelArgs, "language model"), (VisionEncoderArgs, "vision encoder"),
            (AudioEncoderArgs, "audio encoder"), (FreezingArgs, "freezing"),
            (DataArgs, "data"), (ParallelArgs, "parallelism"),
            (PipelineArgs, "pipeline partition"), (EncoderScheduleArgs, "encoder schedule"),
            (RecomputeArgs, "activation recomputation"), (TrainingArgs, "training"),
            (CheckpointArgs, "checkpointing"), (ValidationArgs, "validation"),
            (LoggingArgs, "logging"), (ExitsArgs, "exits and checks"),
            (Fp8Args, "FP8 (Transformer Engine)"),
            (FusionArgs, "kernel fusions (Megatron-LM's: each on where its kernel exists, on "
                         "CUDA; none without CUDA)"),
            (MoeArgs, "mixture of experts (Megatron-LM's MoE flags; the LLM's MLPs)"))

__all__ = ["AudioEncoderArgs", "CheckpointArgs", "DERIVED", "DataArgs", "EncoderScheduleArgs",
           "ExitsArgs", "Fp8Args", "FreezingArgs", "FusionArgs", "GROUPS", "GROUP_CLASSES",
           "LanguageModelArgs", "LoggingArgs", "ModelArgs", "MoeArgs", "ParallelArgs",
           "PipelineArgs", "RecomputeArgs", "SECTIONS", "TrainingArgs", "ValidationArgs",
           "VisionEncoderArgs", "derived_names", "flag_fields", "from_values", "to_values"]
