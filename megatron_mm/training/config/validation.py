"""The run's flags checked together, up front: a ConfigError names the flag; Megatron's
derived values (the world's sizes, the micro-batches per step, the model config) computed.
No torch import."""

from __future__ import annotations

import argparse
import copy
import os
from typing import Optional

from ...config import ConfigError
from ...families import SLOTS
from ...plan.pipeline.partition import parse_partition_flag
from .data_args import validate_data_args
from .fp8_args import validate_fp8_args
from .linear_attention_args import check_gdn_context_parallel
from .logging_args import validate_logging_args
from .lora_args import lora_config
from .model_config import build_model_config
from .module_lr_args import validate_module_lr_args
from .moe_args import validate_moe_args
from .separate_args import validate_separate, validate_separate_sizes
from .sequence_parallel import validate_sequence_parallel
from .transformer_impl import validate_transformer_impl


def validate_args(args: argparse.Namespace,
                  world_size: Optional[int] = None) -> argparse.Namespace:
    """Check the flags together; returns them with Megatron's dependent values derived (a
    copy: ``args`` is not written to)."""
    args = copy.copy(args)
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if args.num_layers_per_virtual_pipeline_stage is not None:
        if args.virtual_pipeline_model_parallel_size is not None:
            raise ConfigError("pass --virtual-pipeline-model-parallel-size or "
                              "--num-layers-per-virtual-pipeline-stage, not both")
        per_rank, rem = divmod(args.num_layers // max(pp, 1),
                               args.num_layers_per_virtual_pipeline_stage)
        if rem:
            raise ConfigError("--num-layers-per-virtual-pipeline-stage must divide the "
                              "layers per pipeline rank")
        args.virtual_pipeline_model_parallel_size = per_rank
    vpp = args.virtual_pipeline_model_parallel_size
    if vpp is not None and vpp <= 1:
        args.virtual_pipeline_model_parallel_size = vpp = None
    if vpp is not None and pp < 2:
        raise ConfigError("virtual pipeline stages need --pipeline-model-parallel-size >= 2")
    policy = parse_partition_flag(args.pipeline_partition)  # the flag stays as typed
    if isinstance(policy, list) and len(policy) != pp * (vpp or 1):
        raise ConfigError(
            f"--pipeline-partition lists {len(policy)} stages, but "
            f"--pipeline-model-parallel-size ({pp})"
            + (f" x --virtual-pipeline-model-parallel-size ({vpp})" if vpp else "")
            + f" = {pp * (vpp or 1)}; give one layer count per stage")
    _validate_search_and_recompute(args)
    cp = args.context_parallel_size
    if cp < 1:
        raise ConfigError("--context-parallel-size must be >= 1")
    check_gdn_context_parallel(args)
    if args.overlap_param_gather and not (args.use_distributed_optimizer
                                          and args.overlap_grad_reduce):
        raise ConfigError("--overlap-param-gather needs --use-distributed-optimizer and "
                          "--overlap-grad-reduce (as in Megatron-LM)")
    if args.context_parallel_block < 1:
        raise ConfigError("--context-parallel-block must be >= 1")
    if args.context_parallel_block_overhead < 0:
        raise ConfigError("--context-parallel-block-overhead must be >= 0")
    if not args.fp8_emulation:  # the emulation's own check names what to change
        validate_transformer_impl(args)
    if args.encoder_schedule == "separate":  # the LLM has the ranks the encoders leave
        world_size = validate_separate_sizes(args, world_size)
    else:
        for flag in ["encoder_data_parallel_size"] + [
                f"{slot}_encoder_data_parallel_size" for slot in SLOTS]:
            if getattr(args, flag) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')} needs --encoder-schedule "
                                  "separate")
    if world_size % (tp * pp * cp):
        raise ConfigError(
            f"world size {world_size} is not divisible by --tensor-model-parallel-size ({tp})"
            f" x --pipeline-model-parallel-size ({pp})"
            f" x --context-parallel-size ({cp})")
    args.world_size = world_size
    args.data_parallel_size = world_size // (tp * pp * cp)
    dp, mbs = args.data_parallel_size, args.micro_batch_size
    if args.global_batch_size is None:
        args.global_batch_size = mbs * dp
    if args.global_batch_size % (mbs * dp):
        raise ConfigError(
            f"--global-batch-size ({args.global_batch_size}) must be a multiple of "
            f"--micro-batch-size ({mbs}) x data-parallel size ({dp})")
    args.num_microbatches = args.global_batch_size // (mbs * dp)
    if vpp is not None and args.num_microbatches % pp:
        raise ConfigError(
            f"interleaved 1F1B needs the micro-batches per step ({args.num_microbatches} = "
            f"--global-batch-size / (--micro-batch-size x data-parallel size)) to be a "
            f"multiple of --pipeline-model-parallel-size ({pp})")
    if not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    if args.lr_decay_iters is None:
        args.lr_decay_iters = max(args.train_iters, 1)
    if args.lr_warmup_iters > args.lr_decay_iters:
        raise ConfigError(f"--lr-warmup-iters ({args.lr_warmup_iters}) exceeds "
                          f"--lr-decay-iters ({args.lr_decay_iters})")
    if args.min_lr > args.lr:
        raise ConfigError(f"--min-lr ({args.min_lr}) exceeds --lr ({args.lr})")
    if args.save_interval is not None and args.save is None:
        raise ConfigError("--save-interval needs --save DIR")
    if args.ckpt_step is not None and args.ckpt_step < 0:
        raise ConfigError("--ckpt-step must not be negative")
    if args.ckpt_step and args.load is None:
        raise ConfigError("--ckpt-step needs --load DIR")
    if args.eval_interval is None:
        args.eval_interval = max(args.train_iters, 1)
    if args.train_iters < 0:  # 0 with --save writes the initial checkpoint
        raise ConfigError("--train-iters must not be negative")
    for flag in ("log_interval", "eval_interval"):
        if getattr(args, flag) <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be positive")
    if args.eval_iters < 0:  # 0: no validation, as in Megatron-LM
        raise ConfigError("--eval-iters must not be negative (0 disables validation)")
    if args.eval_max_new_tokens < 0:  # 0: no answer accuracy
        raise ConfigError("--eval-max-new-tokens must not be negative (0: no answer accuracy)")
    validate_logging_args(args)
    _validate_data_balance(args)
    validate_data_args(args)
    from ..config.run_config import group_of_flags  # its groups are made from this parser

    args.model_config = build_model_config(group_of_flags("model", args),
                                           group_of_flags("moe", args))
    _validate_encoder_schedule(args)
    validate_sequence_parallel(args)
    validate_moe_args(args)
    args.model_config.lora = lora_config(args)
    validate_module_lr_args(args, [m for m, _ in args.model_config.lora.targets]
                            if args.model_config.lora else ())
    args.model_config.validate_parallel(tp, args.encoder_tensor_model_parallel_size)
    validate_fp8_args(args)
    # The pipeline plan needs the vocabulary: the Trainer plans once the tokenizer loads.
    return args


def _validate_encoder_schedule(args: argparse.Namespace) -> None:
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if args.vision_dp_when_cp and args.encoder_schedule != "megatron":
        raise ConfigError(f"--vision-dp-when-cp needs --encoder-schedule megatron (the "
                          f"schedule executor of --encoder-schedule {args.encoder_schedule} "
                          "runs each micro-batch's items whole on every CP rank)")
    if args.encoder_schedule == "auto":  # the plan picks, among the options these allow
        _validate_auto(args)
        _validate_encoder_interleaving(args)
        return
    if args.encoder_schedule == "separate":
        validate_separate(args)
        return
    if args.encoder_schedule == "megatron":
        for flag in ("encoder_pipeline_model_parallel_size",
                     "encoder_tensor_model_parallel_size",
                     "encoder_virtual_pipeline_model_parallel_size"):
            if getattr(args, flag) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')} needs --encoder-schedule "
                                  "coarse or bubble")
        return
    if args.encoder_pipeline_model_parallel_size is None:
        args.encoder_pipeline_model_parallel_size = pp
    _validate_encoder_interleaving(args)
    etp = args.encoder_tensor_model_parallel_size
    if etp is not None and (etp < 1 or tp % etp):
        raise ConfigError(f"--encoder-tensor-model-parallel-size ({etp}) must divide "
                          f"--tensor-model-parallel-size ({tp})")
    if etp is None:
        args.encoder_tensor_model_parallel_size = tp
    blockers = [(args.pipeline_partition == "search", "--pipeline-partition search"),
                (args.recompute_memory_budget is not None, "--recompute-memory-budget"),
                # encoder replicas' groups assume one CP rank (their TP x CP group)
                (args.encoder_tensor_model_parallel_size < tp
                 and args.context_parallel_size > 1,
                 "--encoder-tensor-model-parallel-size below --tensor-model-parallel-size "
                 "and --context-parallel-size > 1 together")]
    for blocked, flag in blockers:
        if blocked:
            raise ConfigError(f"--encoder-schedule {args.encoder_schedule} does not combine "
                              f"with {flag} yet: drop one of them")


def _validate_encoder_interleaving(args: argparse.Namespace) -> None:
    """``--encoder-virtual-pipeline-model-parallel-size``: at least 1; above 1 over an
    encoder pipeline of at least 2 stages (one stage has nothing to interleave with)."""
    v = args.encoder_virtual_pipeline_model_parallel_size
    if v is None:
        return
    if v < 1:
        raise ConfigError(f"--encoder-virtual-pipeline-model-parallel-size must be at least "
                          f"1 (got {v})")
    stages = args.encoder_pipeline_model_parallel_size or args.pipeline_model_parallel_size
    if v > 1 and stages < 2:
        raise ConfigError(f"--encoder-virtual-pipeline-model-parallel-size {v} interleaves "
                          "the encoder over its pipeline stages: it needs "
                          "--encoder-pipeline-model-parallel-size of at least 2 (it is "
                          f"{stages})")


def _validate_auto(args: argparse.Namespace) -> None:
    """``--encoder-schedule auto``: what it can choose from (the choice itself is made with
    the training plan, on the real vocabulary: ``planning/encoder_schedule_auto.py``)."""
    tp, etp = args.tensor_model_parallel_size, args.encoder_tensor_model_parallel_size
    if etp is not None and (etp < 1 or tp % etp):
        raise ConfigError(f"--encoder-tensor-model-parallel-size ({etp}) must divide "
                          f"--tensor-model-parallel-size ({tp})")
    if etp is not None and etp < tp and (args.pipeline_partition == "search"
                                         or args.recompute_memory_budget is not None
                                         or args.context_parallel_size > 1):
        raise ConfigError("--encoder-schedule auto has nothing to choose from: "
                          "--encoder-tensor-model-parallel-size below --tensor-model-parallel-"
                          "size needs the encoder as its own pipeline, which "
                          "--pipeline-partition search / --recompute-memory-budget / "
                          "--context-parallel-size > 1 exclude")


def _validate_search_and_recompute(args: argparse.Namespace) -> None:
    for flag in ("pipeline_search_candidates", "pipeline_search_iters"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1")
    if args.pipeline_search_radius < 0:
        raise ConfigError("--pipeline-search-radius must be >= 0")
    gran, method, n = (args.recompute_granularity, args.recompute_method,
                       args.recompute_num_layers)
    if args.recompute_memory_budget is not None:
        if args.recompute_memory_budget <= 0:
            raise ConfigError("--recompute-memory-budget must be positive (GB per rank)")
        if gran not in (None, "full") or method not in (None, "block") or n is not None:
            raise ConfigError("--recompute-memory-budget chooses --recompute-num-layers per "
                              "stage for --recompute-granularity full --recompute-method "
                              "block: drop the other --recompute-* flags")
        args.recompute_granularity, args.recompute_method = "full", "block"
        return
    if gran == "selective" and (method is not None or n is not None):
        raise ConfigError("--recompute-granularity selective takes no --recompute-method "
                          "or --recompute-num-layers")
    if gran == "full" and (method is None or n is None):
        raise ConfigError("--recompute-granularity full needs --recompute-method "
                          "(uniform or block) and --recompute-num-layers")
    if gran is None and (method is not None or n is not None):
        raise ConfigError("--recompute-method and --recompute-num-layers need "
                          "--recompute-granularity full")
    if n is not None and n < 1:
        raise ConfigError("--recompute-num-layers must be >= 1")


def _validate_data_balance(args: argparse.Namespace) -> None:
    from ...plan.balance import parse_bounds  # pure Python

    if args.data_balance == "none":
        return
    parse_bounds(args.data_balance_bounds)  # a PlanError (ConfigError) names the flag
    if args.data_balance_iters < 1:
        raise ConfigError("--data-balance-iters must be >= 1")
