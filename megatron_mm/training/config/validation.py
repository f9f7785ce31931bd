"""The run's configuration checked as a whole, up front: each group checks its own fields
(``groups/*.py``: ``errors()``), the checks across groups are here; a ConfigError names the
flag. What validation derives (the world's sizes, the micro-batches per step, the defaults
that follow from other flags, the model config) goes into a new frozen RunConfig by
``dataclasses.replace``: the input is never written to. No torch import."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import TYPE_CHECKING, List, Optional

from ...config import ConfigError
from ...families import SLOTS
from ...plan.pipeline.partition import parse_partition_flag
from .data_args import validate_data_args
from .fp8_args import validate_fp8_args
from .groups import GROUPS
from .linear_attention_args import check_gdn_context_parallel
from .logging_args import validate_logging_args
from .lora_args import lora_config
from .model_config import build_model_config
from .module_lr_args import validate_module_lr_args
from .moe_args import validate_moe_args
from .separate_args import validate_separate, validate_separate_sizes
from .sequence_parallel import validate_sequence_parallel
from .transformer_impl import validate_transformer_impl

if TYPE_CHECKING:
    from .run_config import RunConfig


def group_errors(config: "RunConfig") -> List[ConfigError]:
    """Every group's own errors, in the groups' order."""
    return [e for group in GROUPS if hasattr(getattr(config, group), "errors")
            for e in getattr(config, group).errors()]


def validated(config: "RunConfig", world_size: Optional[int] = None) -> "RunConfig":
    """``config`` checked for ``world_size`` ranks (default ``$WORLD_SIZE``), with what
    validation derives; the first error raised."""
    errors = group_errors(config)
    if errors:
        raise errors[0]
    return derive(config, world_size)


def derive(config: "RunConfig", world_size: Optional[int] = None) -> "RunConfig":
    """The checks across groups, in order, and the derived values (each group's own checks
    passed)."""
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    config = replace(config, parallel=_virtual_pipeline(config),
                     recompute=config.recompute.derived())
    par, pipe = config.parallel, config.pipeline
    tp, pp, cp = (par.tensor_model_parallel_size, par.pipeline_model_parallel_size,
                  par.context_parallel_size)
    vpp = par.virtual_pipeline_model_parallel_size
    policy = parse_partition_flag(pipe.pipeline_partition)  # the flag stays as typed
    if isinstance(policy, list) and len(policy) != pp * (vpp or 1):
        raise ConfigError(
            f"--pipeline-partition lists {len(policy)} stages, but "
            f"--pipeline-model-parallel-size ({pp})"
            + (f" x --virtual-pipeline-model-parallel-size ({vpp})" if vpp else "")
            + f" = {pp * (vpp or 1)}; give one layer count per stage")
    check_gdn_context_parallel(config)
    if not config.fp8.fp8_emulation:  # the emulation's own check names what to change
        validate_transformer_impl(config)
    if config.encoder_schedule.encoder_schedule == "separate":  # the LLM has the ranks left
        config, world_size = validate_separate_sizes(config, world_size)
    else:
        for flag in ["encoder_data_parallel_size"] + [
                f"{slot}_encoder_data_parallel_size" for slot in SLOTS]:
            if getattr(config.encoder_schedule, flag) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')} needs --encoder-schedule "
                                  "separate")
    if world_size % (tp * pp * cp):
        raise ConfigError(
            f"world size {world_size} is not divisible by --tensor-model-parallel-size ({tp})"
            f" x --pipeline-model-parallel-size ({pp})"
            f" x --context-parallel-size ({cp})")
    config = _derive_sizes(config, world_size)
    validate_logging_args(config)
    validate_data_args(config)
    model = config.model
    if not model.group_query_attention:
        model = replace(model, num_query_groups=model.num_attention_heads)
    config = replace(config, model=model,
                     model_config=build_model_config(model, config.moe))
    config = _encoder_schedule(config)
    if config.parallel.sequence_parallel and tp == 1:  # Megatron-LM turns it off there
        config = replace(config, parallel=replace(config.parallel, sequence_parallel=False))
    validate_sequence_parallel(config)
    config = validate_moe_args(config)
    # a new model config (built above for this config alone) gets its adapters
    config.model_config.lora = lora_config(config)
    validate_module_lr_args(config, [m for m, _ in config.model_config.lora.targets]
                            if config.model_config.lora else ())
    config.model_config.validate_parallel(
        tp, config.encoder_schedule.encoder_tensor_model_parallel_size)
    # The pipeline plan needs the vocabulary: the Trainer plans once the tokenizer loads.
    return validate_fp8_args(config)


def _virtual_pipeline(config: "RunConfig"):
    """The parallel group with ``--virtual-pipeline-model-parallel-size`` from
    ``--num-layers-per-virtual-pipeline-stage`` (1: none)."""
    par = config.parallel
    pp, vpp = par.pipeline_model_parallel_size, par.virtual_pipeline_model_parallel_size
    if par.num_layers_per_virtual_pipeline_stage is not None:
        if vpp is not None:
            raise ConfigError("pass --virtual-pipeline-model-parallel-size or "
                              "--num-layers-per-virtual-pipeline-stage, not both")
        vpp, rem = divmod(config.model.num_layers // max(pp, 1),
                          par.num_layers_per_virtual_pipeline_stage)
        if rem:
            raise ConfigError("--num-layers-per-virtual-pipeline-stage must divide the "
                              "layers per pipeline rank")
    if vpp is not None and vpp <= 1:
        vpp = None
    if vpp is not None and pp < 2:
        raise ConfigError("virtual pipeline stages need --pipeline-model-parallel-size >= 2")
    return replace(par, virtual_pipeline_model_parallel_size=vpp)


def _derive_sizes(config: "RunConfig", world_size: int) -> "RunConfig":
    """The world's sizes, the global batch (default one micro-batch per DP rank), the
    micro-batches per step, and the learning-rate decay and validation intervals."""
    par, tr = config.parallel, config.training
    dp = world_size // (par.tensor_model_parallel_size * par.pipeline_model_parallel_size
                        * par.context_parallel_size)
    mbs, pp = tr.micro_batch_size, par.pipeline_model_parallel_size
    gbs = tr.global_batch_size if tr.global_batch_size is not None else mbs * dp
    if gbs % (mbs * dp):
        raise ConfigError(
            f"--global-batch-size ({gbs}) must be a multiple of "
            f"--micro-batch-size ({mbs}) x data-parallel size ({dp})")
    m = gbs // (mbs * dp)
    if par.virtual_pipeline_model_parallel_size is not None and m % pp:
        raise ConfigError(
            f"interleaved 1F1B needs the micro-batches per step ({m} = "
            f"--global-batch-size / (--micro-batch-size x data-parallel size)) to be a "
            f"multiple of --pipeline-model-parallel-size ({pp})")
    val = config.validation
    return replace(
        config, parallel=replace(par, world_size=world_size, data_parallel_size=dp),
        training=replace(tr, global_batch_size=gbs, num_microbatches=m,
                         lr_decay_iters=tr.decay_iters),
        validation=replace(val, eval_interval=(val.eval_interval if val.eval_interval
                                               is not None else max(tr.train_iters, 1))))


def _encoder_schedule(config: "RunConfig") -> "RunConfig":
    """The encoder schedule's flags against the rest; its defaults (a coarse or bubble
    schedule's encoder pipeline and TP: the LLM's)."""
    es, par = config.encoder_schedule, config.parallel
    tp, pp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size
    schedule = es.encoder_schedule
    if par.vision_dp_when_cp and schedule != "megatron":
        raise ConfigError(f"--vision-dp-when-cp needs --encoder-schedule megatron (the "
                          f"schedule executor of --encoder-schedule {schedule} "
                          "runs each micro-batch's items whole on every CP rank)")
    if schedule == "auto":  # the plan picks, among the options these allow
        _check_auto(config)
        _check_encoder_interleaving(es, pp)
        return config
    if schedule == "separate":
        validate_separate(config)
        return config
    if schedule == "megatron":
        for flag in ("encoder_pipeline_model_parallel_size",
                     "encoder_tensor_model_parallel_size",
                     "encoder_virtual_pipeline_model_parallel_size"):
            if getattr(es, flag) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')} needs --encoder-schedule "
                                  "coarse or bubble")
        return config
    if es.encoder_pipeline_model_parallel_size is None:
        es = replace(es, encoder_pipeline_model_parallel_size=pp)
    _check_encoder_interleaving(es, pp)
    etp = es.encoder_tensor_model_parallel_size
    if etp is not None and (etp < 1 or tp % etp):
        raise ConfigError(f"--encoder-tensor-model-parallel-size ({etp}) must divide "
                          f"--tensor-model-parallel-size ({tp})")
    if etp is None:
        es = replace(es, encoder_tensor_model_parallel_size=tp)
    blockers = [(config.pipeline.pipeline_partition == "search", "--pipeline-partition search"),
                (config.recompute.recompute_memory_budget is not None,
                 "--recompute-memory-budget"),
                # encoder replicas' groups assume one CP rank (their TP x CP group)
                (es.encoder_tensor_model_parallel_size < tp
                 and par.context_parallel_size > 1,
                 "--encoder-tensor-model-parallel-size below --tensor-model-parallel-size "
                 "and --context-parallel-size > 1 together")]
    for blocked, flag in blockers:
        if blocked:
            raise ConfigError(f"--encoder-schedule {schedule} does not combine "
                              f"with {flag} yet: drop one of them")
    return replace(config, encoder_schedule=es)


def _check_encoder_interleaving(es, pp: int) -> None:
    """``--encoder-virtual-pipeline-model-parallel-size``: at least 1; above 1 over an
    encoder pipeline of at least 2 stages (one stage has nothing to interleave with)."""
    v = es.encoder_virtual_pipeline_model_parallel_size
    if v is None:
        return
    if v < 1:
        raise ConfigError(f"--encoder-virtual-pipeline-model-parallel-size must be at least "
                          f"1 (got {v})")
    stages = es.encoder_pipeline_model_parallel_size or pp
    if v > 1 and stages < 2:
        raise ConfigError(f"--encoder-virtual-pipeline-model-parallel-size {v} interleaves "
                          "the encoder over its pipeline stages: it needs "
                          "--encoder-pipeline-model-parallel-size of at least 2 (it is "
                          f"{stages})")


def _check_auto(config: "RunConfig") -> None:
    """``--encoder-schedule auto``: what it can choose from (the choice itself is made with
    the training plan, on the real vocabulary: ``planning/encoder_schedule_auto.py``)."""
    tp = config.parallel.tensor_model_parallel_size
    etp = config.encoder_schedule.encoder_tensor_model_parallel_size
    if etp is not None and (etp < 1 or tp % etp):
        raise ConfigError(f"--encoder-tensor-model-parallel-size ({etp}) must divide "
                          f"--tensor-model-parallel-size ({tp})")
    if etp is not None and etp < tp and (config.pipeline.pipeline_partition == "search"
                                         or config.recompute.recompute_memory_budget is not None
                                         or config.parallel.context_parallel_size > 1):
        raise ConfigError("--encoder-schedule auto has nothing to choose from: "
                          "--encoder-tensor-model-parallel-size below --tensor-model-parallel-"
                          "size needs the encoder as its own pipeline, which "
                          "--pipeline-partition search / --recompute-memory-budget / "
                          "--context-parallel-size > 1 exclude")


def validate_args(args: argparse.Namespace,
                  world_size: Optional[int] = None) -> argparse.Namespace:
    """The namespace entry points' adapter (the package's parser, Megatron-LM's parsed
    args): ``args`` checked by ``RunConfig.validated``, returned as a new namespace with
    the derived values (``args`` is not written to)."""
    from .run_config import RunConfig

    config = RunConfig.from_flags(args).validated(world_size)
    return argparse.Namespace(**{**vars(args), **config.flags(),
                                 "model_config": config.model_config,
                                 "fp8_settings": config.fp8_settings})
