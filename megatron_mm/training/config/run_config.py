"""The run's configuration, typed: the validated flags in frozen groups, as Megatron-LM
groups its arguments, with what validation derives from them.

A group's fields are the parser's dests (Megatron-LM's attribute names: code that reads
``.seq_length`` reads it from the model group, and an encoder family's hooks read their
flags from it). The parser is the one source of the fields, their types and defaults: each
group is made from the flags of its ``--help`` sections (``SECTIONS``), the flags named in
``BY_NAME`` (a section that mixes concerns), and the values validation derives
(``DERIVED``: the world's sizes, the micro-batches per step). No torch import.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Dict, Optional

from ...config import MultimodalModelConfig
from ...families import SLOTS
from ...plan.fp8 import Fp8Settings
from .arguments import build_parser, parse_args

# group -> the --help sections whose flags it holds (a title, or its start)
SECTIONS = {
    "model": ("language model", "vision encoder", "audio encoder", "freezing"),
    "parallel": ("parallelism", "sequence parallelism"),
    "recompute": ("activation recomputation",),
    "training": ("training",),
    "checkpoint": ("checkpointing",),
    "data": ("data sources", "data, logging and evaluation"),
    "logging": ("logging",),
    "exits": ("exits and checks",),
    "fp8": ("FP8",),
    "fusion": ("kernel fusions",),
    "moe": ("mixture of experts",),
}
# flags whose section mixes concerns: their group by name (before SECTIONS)
BY_NAME = {
    "model": ("image_processor_config",),  # the encoders' input, as the checkpoint fixes
    "pipeline": ("pipeline_partition", "pipeline_search_radius", "pipeline_search_candidates",
                 "pipeline_search_iters", "memory_limit_gb", "pipeline_profile"),
    "encoder_schedule": ("encoder_schedule", "encoder_pipeline_model_parallel_size",
                         "encoder_tensor_model_parallel_size",
                         "encoder_virtual_pipeline_model_parallel_size",
                         "encoder_data_parallel_size", "encoder_pieces",
                         "encoder_placement")
    + tuple(f"{slot}_encoder_data_parallel_size" for slot in SLOTS),
    "logging": ("log_interval",),
    "validation": ("eval_interval", "eval_iters", "eval_max_new_tokens", "skip_final_eval"),
}
# what validation derives, saved in checkpoints with the flags (Megatron-LM's names)
DERIVED = {
    "parallel": (("world_size", int), ("data_parallel_size", int)),
    "training": (("num_microbatches", int),),
}
GROUPS = ("model", "parallel", "pipeline", "encoder_schedule", "recompute", "training",
          "checkpoint", "data", "validation", "logging", "exits", "fp8", "fusion", "moe")


def _flag_type(action: argparse.Action) -> Any:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                           argparse.BooleanOptionalAction)):
        kind = bool
    else:
        kind = action.type or str
        if action.nargs not in (None, "?"):
            kind = tuple
    return Optional[kind] if action.default is None else kind


def group_of(dest: str, section: str) -> str:
    for group, names in BY_NAME.items():
        if dest in names:
            return group
    for group, titles in SECTIONS.items():
        if any(section.startswith(title) for title in titles):
            return group
    raise KeyError(f"--{dest.replace('_', '-')} (section {section!r}) has no group")


def _group_fields(parser: argparse.ArgumentParser) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {group: {} for group in GROUPS}
    for section in parser._action_groups:
        if section.title in ("positional arguments", "options"):
            continue
        for action in section._group_actions:
            out[group_of(action.dest, section.title)].setdefault(action.dest,
                                                                 _flag_type(action))
    for group, derived in DERIVED.items():
        out[group].update(derived)
    return out


def _class_name(group: str) -> str:
    return "".join(part.capitalize() for part in group.split("_")) + "Args"


def _group_class(group: str) -> type:
    cls = dataclasses.make_dataclass(_class_name(group), list(FIELDS[group].items()),
                                     frozen=True)
    cls.__module__ = __name__  # picklable, as this module's ModelArgs, ParallelArgs ...
    return cls


FIELDS = _group_fields(build_parser())
# One frozen dataclass per group: ModelArgs, ParallelArgs, PipelineArgs, ...
GROUP_CLASSES = {group: _group_class(group) for group in GROUPS}
globals().update({cls.__name__: cls for cls in GROUP_CLASSES.values()})


def group_of_flags(group: str, args):
    """One group of a namespace of flags (validation builds the model config from the
    model group)."""
    values = vars(args)
    return GROUP_CLASSES[group](**{name: values.get(name) for name in FIELDS[group]})


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The run's groups of flags, its model config (without the tokenizer's vocabulary)
    and FP8 settings (None without ``--fp8-format``)."""

    model: Any  # ModelArgs
    parallel: Any  # ParallelArgs
    pipeline: Any  # PipelineArgs
    encoder_schedule: Any  # EncoderScheduleArgs
    recompute: Any  # RecomputeArgs
    training: Any  # TrainingArgs
    checkpoint: Any  # CheckpointArgs
    data: Any  # DataArgs
    validation: Any  # ValidationArgs
    logging: Any  # LoggingArgs
    exits: Any  # ExitsArgs
    fp8: Any  # Fp8Args
    fusion: Any  # FusionArgs
    moe: Any  # MoeArgs
    model_config: MultimodalModelConfig
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
            out.update(dataclasses.asdict(getattr(self, group)))
        return out

    def namespace(self) -> argparse.Namespace:
        """A fresh namespace of these flags, for the flags' validators to check a variant
        (``--encoder-schedule auto`` trying encoder TPs); the run reads the groups."""
        return argparse.Namespace(**self.flags(), model_config=self.model_config,
                                  fp8_settings=self.fp8_settings)


def parse_run_config(argv=None, world_size: Optional[int] = None) -> RunConfig:
    """The command line's RunConfig (``arguments.parse_args``: a bad flag exits with one
    line naming it)."""
    return RunConfig.from_flags(parse_args(argv, world_size))


def encoder_replicas(config) -> int:
    """Encoder replicas per LLM TP group (TP / encoder TP)."""
    etp = config.encoder_schedule.encoder_tensor_model_parallel_size
    return config.parallel.tensor_model_parallel_size // etp if etp else 1
