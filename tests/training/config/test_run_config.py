"""The typed run configuration: every flag in exactly one frozen group under its
Megatron-LM name, the groups the one source of the parser's defaults, and the groups
together holding what a checkpoint saves of the flags."""

import dataclasses

import pytest

from megatron_mm.training.cli.arguments import build_parser, parse_args
from megatron_mm.families.flags import flag_classes
from megatron_mm.training.config.groups import flag_fields
from megatron_mm.training.config.run_config import GROUP_CLASSES, GROUPS, RunConfig


def test_every_flag_is_in_one_group():
    dests = {a.dest for a in build_parser()._actions if a.dest != "help"}
    placed = [f.name for cls in (*GROUP_CLASSES.values(), *flag_classes())
              for f in flag_fields(cls)]
    assert len(placed) == len(set(placed))
    assert set(placed) == dests


def test_the_groups_are_the_parsers_defaults():
    defaults = vars(build_parser().parse_args([]))
    for cls in (*GROUP_CLASSES.values(), *flag_classes()):
        group = cls()
        for f in flag_fields(cls):
            assert defaults[f.name] == getattr(group, f.name), (cls.__name__, f.name)


def test_groups_hold_the_validated_flags():
    args = parse_args(["--tensor-model-parallel-size", "2", "--seq-length", "64",
                       "--encoder-schedule", "bubble", "--pipeline-model-parallel-size",
                       "2", "--micro-batch-size", "2"], world_size=8)
    config = RunConfig.from_flags(args)
    assert config.parallel.tensor_model_parallel_size == 2
    assert config.parallel.data_parallel_size == 2
    assert config.model.seq_length == 64
    assert config.encoder_schedule.encoder_pipeline_model_parallel_size == 2
    assert config.training.num_microbatches == 1
    assert config.model_config is args.model_config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model.seq_length = 32
    saved = {k: v for k, v in vars(args).items() if k not in ("model_config", "fp8_settings")}
    assert config.flags() == saved


def test_validation_writes_nothing_into_the_namespace():
    from megatron_mm.training.cli.arguments import build_parser
    from megatron_mm.training.config.validation import validate_args

    args = build_parser().parse_args(["--micro-batch-size", "2", "--encoder-schedule",
                                      "coarse", "--pipeline-model-parallel-size", "2"])
    before = dict(vars(args))
    checked = validate_args(args, world_size=4)
    assert vars(args) == before
    assert checked.data_parallel_size == 2 and checked.encoder_pipeline_model_parallel_size == 2


def test_saved_flags_read_back_into_the_same_groups():
    """A checkpoint keeps RunConfig.flags() (with the run's own values beside them); read
    back, they make the same groups."""
    import argparse

    config = RunConfig.from_flags(parse_args(["--seq-length", "64"], world_size=2))
    saved = {**config.flags(), "consumed_train_samples": 8, "padded_vocab_size": 384}
    back = RunConfig.from_flags(argparse.Namespace(**saved))
    assert all(getattr(back, g) == getattr(config, g) for g in GROUPS)
