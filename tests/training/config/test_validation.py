"""Validation on the typed configuration: each group checks its own fields and names the
flag; ``RunConfig.errors`` lists what is wrong, ``RunConfig.validated`` returns a new
frozen RunConfig with the derived values and leaves its input as it was."""

import dataclasses

from megatron_mm.config import ConfigError
from megatron_mm.training.cli.arguments import build_parser
from megatron_mm.training.config.groups import (CheckpointArgs, ExitsArgs, LoggingArgs,
                                                ParallelArgs, PipelineArgs, RecomputeArgs,
                                                TrainingArgs, ValidationArgs)
from megatron_mm.training.config.run_config import RunConfig


def _config(*argv: str) -> RunConfig:
    return RunConfig.from_flags(build_parser().parse_args(list(argv)))


def test_validated_derives_into_a_new_config_and_leaves_its_input():
    config = _config("--micro-batch-size", "2", "--encoder-schedule", "coarse",
                     "--pipeline-model-parallel-size", "2", "--train-iters", "7",
                     "--sequence-parallel")
    before = dataclasses.replace(config)
    checked = config.validated(world_size=4)
    assert config == before and config.model_config is None
    assert config.parallel.data_parallel_size is None and config.training.num_microbatches is None
    assert checked is not config
    assert (checked.parallel.world_size, checked.parallel.data_parallel_size) == (4, 2)
    assert (checked.training.global_batch_size, checked.training.num_microbatches) == (4, 1)
    assert checked.training.lr_decay_iters == 7 and checked.validation.eval_interval == 7
    assert checked.model.num_query_groups == checked.model.num_attention_heads
    assert checked.encoder_schedule.encoder_pipeline_model_parallel_size == 2
    assert checked.encoder_schedule.encoder_tensor_model_parallel_size == 1
    recompute = _config("--recompute-memory-budget", "10").validated(world_size=1).recompute
    assert (recompute.recompute_granularity, recompute.recompute_method) == ("full", "block")
    assert checked.parallel.sequence_parallel is False  # TP 1: Megatron-LM turns it off
    assert checked.model_config is not None and checked.fp8_settings is None
    # the checked config validates again to itself (a checkpoint's flags re-checked)
    assert checked.validated(world_size=4).flags() == checked.flags()
    assert set(checked.flags()) == set(config.flags())


def test_each_group_names_its_own_flag():
    cases = [
        (PipelineArgs(pipeline_search_iters=0), "--pipeline-search-iters must be >= 1"),
        (RecomputeArgs(recompute_num_layers=2), "--recompute-method and --recompute-num-layers "
                                                "need --recompute-granularity full"),
        (ParallelArgs(context_parallel_block=0), "--context-parallel-block must be >= 1"),
        (TrainingArgs(lr=1e-4, min_lr=1e-3), "--min-lr (0.001) exceeds --lr (0.0001)"),
        # Megatron-Core's OptimizerParamScheduler asserts warmup < decay steps
        (TrainingArgs(train_iters=10, lr_warmup_iters=10),
         "--lr-warmup-iters (10) must be below --lr-decay-iters (10, default --train-iters)"),
        (TrainingArgs(lr=1e-4, lr_warmup_init=1e-3), "--lr-warmup-init (0.001) exceeds --lr "
                                                     "(0.0001)"),
        (CheckpointArgs(save_interval=5), "--save-interval needs --save DIR"),
        (ValidationArgs(eval_interval=0), "--eval-interval must be positive"),
        (LoggingArgs(log_interval=0), "--log-interval must be positive"),
        (ExitsArgs(exit_interval=-1), "--exit-interval must be positive"),
    ]
    for group, message in cases:
        errors = group.errors()
        assert [str(e) for e in errors] == [message], type(group).__name__
        assert all(isinstance(e, ConfigError) for e in errors)
    assert PipelineArgs().errors() == [] and TrainingArgs().errors() == []


def test_run_config_lists_every_groups_errors_and_raises_the_first():
    config = _config("--log-interval", "0", "--save-interval", "5")
    assert [str(e) for e in config.errors(world_size=1)] == [
        "--save-interval needs --save DIR", "--log-interval must be positive"]
    try:
        config.validated(world_size=1)
    except ConfigError as e:
        assert str(e) == "--save-interval needs --save DIR"
    else:
        raise AssertionError("validated() accepted a bad config")
    # a cross-group check, once the groups pass: the first one
    bad_world = _config("--tensor-model-parallel-size", "2")
    assert [str(e) for e in bad_world.errors(world_size=3)] == [
        "world size 3 is not divisible by --tensor-model-parallel-size (2) x "
        "--pipeline-model-parallel-size (1) x --context-parallel-size (1)"]
    assert _config().errors(world_size=2) == []
