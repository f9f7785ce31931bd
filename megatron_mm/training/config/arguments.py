"""Megatron-style command-line arguments, validated up front.

Flags keep Megatron-LM's names and meanings (``--tensor-model-parallel-size``,
``--freeze-LM``, ``--eval-iters`` ...); flags for new ideas follow the same style. No torch
import: a bad flag is reported before any process group exists.
"""

from __future__ import annotations

import argparse
import copy
import os
from typing import Optional, Sequence

from ...config import ConfigError
from ...families import FAMILIES, SLOTS
from ...plan.pipeline.partition import parse_partition_flag
from .data_args import validate_data_args
from .fp8_args import validate_fp8_args
from .groups import SECTIONS, AudioEncoderArgs, VisionEncoderArgs
from .linear_attention_args import CHECKPOINT_FLAGS as LINEAR_ATTENTION_FLAGS
from .linear_attention_args import check_gdn_context_parallel
from .logging_args import validate_logging_args
from .model_config import build_model_config
from .lora_args import lora_config, lora_flags_from_checkpoint
from .module_lr_args import validate_module_lr_args
from .moe_args import refuse_moe_flags_given_to_dense, validate_moe_args
from .separate_args import validate_separate, validate_separate_sizes
from .sequence_parallel import validate_sequence_parallel
from .transformer_impl import validate_transformer_impl
from .user_errors import ArgumentParser, exit_with_user_error


def build_parser() -> argparse.ArgumentParser:
    """The package's parser, made from the typed groups (``groups/``) by Megatron-LM's
    ``ArgumentGroupFactory``: one --help section per group (the model group's four), each
    encoder family's own flags after its slot's section."""
    from .flag_factory import add_group  # Megatron-LM's factory imports megatron.core

    p = ArgumentParser(
        description="Train a multimodal LLM with Megatron-Core (megatron_mm)",
        allow_abbrev=False)
    family_sections = {slot: [] for slot in SLOTS}
    for fam in FAMILIES.values():
        if fam.flags is not None and fam.flags not in family_sections[fam.slot]:
            family_sections[fam.slot].append(fam.flags)
    for cls, title in SECTIONS:
        add_group(p, cls, title)
        slot = {VisionEncoderArgs: "vision", AudioEncoderArgs: "audio"}.get(cls)
        for flags in family_sections.get(slot, ()):
            add_group(p, flags, f"{title}: {flags.__name__}")
    return p


def parse_args(argv: Optional[Sequence[str]] = None,
               world_size: Optional[int] = None) -> argparse.Namespace:
    """``read_args``, a bad flag reported once per job (one line naming it) and exiting."""
    try:
        return read_args(argv, world_size)
    except ConfigError as e:  # once per job, without argparse's usage
        exit_with_user_error(e, build_parser().prog)


def read_args(argv: Optional[Sequence[str]] = None,
              world_size: Optional[int] = None) -> argparse.Namespace:
    """The flags of ``argv`` with those the checkpoint ``--load`` names fixes, checked
    (a ConfigError names the flag), with Megatron's derived values; the run reads them as
    a ``run_config.RunConfig``."""
    args = build_parser().parse_args(argv)
    given = given_flags(argv)
    apply_checkpoint_args(args, given)
    refuse_moe_flags_given_to_dense(args, given)
    return validate_args(args, world_size)


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
    from .run_config import group_of_flags  # its groups are made from this parser

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


# What a checkpoint's saved flags decide when --load names it (Megatron-LM's
# --use-checkpoint-args, always on): the architecture, its tokenizer and image processor.
CHECKPOINT_FLAGS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
    "group_query_attention", "num_query_groups", "kv_channels", "max_position_embeddings",
    "rotary_base", "position_embedding_type", "mrope_section", "mrope_interleaved",
    "use_rope_scaling",
    "rope_scaling_factor", "rotary_scaling_factor", "yarn_original_max_position_embeddings",
    "yarn_beta_fast", "yarn_beta_slow", "mscale", "mscale_all_dim",
    "yarn_correction_range_round_to_int", "add_qkv_bias", "qk_layernorm",
    "untie_embeddings_and_output_weights", "norm_epsilon", "make_vocab_size_divisible_by",
    "vision_model_type", "vision_hidden_size",
    "vision_num_layers", "vision_num_attention_heads", "vision_ffn_hidden_size",
    "vision_feature_layer", "vision_norm_epsilon", "img_h", "img_w", "patch_dim",
    "disable_vision_class_token", "projector_type", "projector_ffn_hidden_size",
    "audio_model_type", "audio_hidden_size", "audio_num_layers", "audio_num_attention_heads",
    "audio_ffn_hidden_size", "audio_num_mel_bins", "audio_max_source_positions",
    "audio_pool_stride", "audio_norm_epsilon", "audio_projector_type", "audio_token_id",
    "image_token_id", "video_token_id", "tokenizer_type", "tokenizer_model",
    "image_processor_config",
    "num_experts", "moe_ffn_hidden_size", "moe_layer_freq", "moe_router_topk",
    "moe_router_pre_softmax", "moe_shared_expert_intermediate_size", "moe_shared_expert_gate",
    *LINEAR_ATTENTION_FLAGS,
) + tuple(dest for f in FAMILIES.values() for dest in f.checkpoint_flags)
# Saved relative to the checkpoint directory (files the converter put there).
CHECKPOINT_PATH_FLAGS = ("tokenizer_model", "image_processor_config")


def given_flags(argv: Optional[Sequence[str]]) -> set:
    """The dests of the flags written on the command line (not left at their default)."""
    probe = build_parser()
    for action in probe._actions:
        action.default = argparse.SUPPRESS
    return set(vars(probe.parse_args(argv)))


def apply_checkpoint_args(args: argparse.Namespace, given: set) -> None:
    """Take the architecture from the checkpoint ``--load`` names: flags left out come
    from it, flags given must agree with it."""
    if not args.load:
        return
    from ..checkpoint.checkpointing import CheckpointError, saved_args  # torch: only with --load
    from .run_config import group_of_flags  # its groups are made from this parser

    try:
        saved = saved_args(group_of_flags("checkpoint", args))
    except CheckpointError:
        return  # reported with the other --load problems when loading
    for dest in CHECKPOINT_FLAGS:
        if dest not in saved:
            continue
        value = saved[dest]
        if dest in CHECKPOINT_PATH_FLAGS and value and not os.path.isabs(value):
            value = os.path.join(args.load, value)
        if isinstance(value, list):
            value = tuple(value)
        given_value = getattr(args, dest)
        if isinstance(given_value, list):  # nargs flags: compare as the saved tuple
            given_value = tuple(given_value)
        if dest in given and given_value != value:
            flag = "--" + dest.replace("_", "-")
            raise ConfigError(f"{flag} {getattr(args, dest)} disagrees with the checkpoint in "
                              f"--load {args.load} ({value}); drop the flag to use the "
                              f"checkpoint's value")
        setattr(args, dest, value)
    lora_flags_from_checkpoint(args, saved, given)  # its adapters, as it was saved


def _validate_data_balance(args: argparse.Namespace) -> None:
    from ...plan.balance import parse_bounds  # pure Python

    if args.data_balance == "none":
        return
    parse_bounds(args.data_balance_bounds)  # a PlanError (ConfigError) names the flag
    if args.data_balance_iters < 1:
        raise ConfigError("--data-balance-iters must be >= 1")
