"""Megatron-style command-line arguments, validated up front.

Flags keep Megatron-LM's names and meanings (``--tensor-model-parallel-size``,
``--freeze-LM``, ``--eval-iters`` ...); flags for new ideas follow the same style. The parser
is made from the typed groups (``config/groups/``); a bad flag is reported before any
process group exists, once per job.
"""

from __future__ import annotations

import argparse
import os
from typing import Optional, Sequence

from ...config import ConfigError
from ...families import FAMILIES, SLOTS
from ..config.groups import SECTIONS, AudioEncoderArgs, VisionEncoderArgs
from ..config.linear_attention_args import CHECKPOINT_FLAGS as LINEAR_ATTENTION_FLAGS
from ..config.lora_args import lora_flags_from_checkpoint
from ..config.moe_args import refuse_moe_flags_given_to_dense
from ..config.run_config import RunConfig
from ..config.validation import validate_args
from .recipe_flags import recipe_defaults, split_recipe
from .user_errors import ArgumentParser, exit_with_user_error


def build_parser() -> argparse.ArgumentParser:
    """The package's parser, made from the typed groups (``groups/``) by Megatron-LM's
    ``ArgumentGroupFactory``: one --help section per group (the model group's four), each
    encoder family's own flags after its slot's section."""
    from .flag_factory import add_group  # Megatron-LM's factory imports megatron.core

    p = ArgumentParser(
        description="Train a multimodal LLM with Megatron-Core (megatron_mm)",
        epilog="--recipe NAME: a recipe's values (megatron_mm/recipes, "
               "docs/recipes.md) as the defaults; the flags given win",
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


def parse_run_config(argv: Optional[Sequence[str]] = None,
                     world_size: Optional[int] = None) -> RunConfig:
    """The command line's RunConfig (``parse_args``: a bad flag exits with one line naming
    it)."""
    return RunConfig.from_flags(parse_args(argv, world_size))


def read_args(argv: Optional[Sequence[str]] = None,
              world_size: Optional[int] = None) -> argparse.Namespace:
    """The flags of ``argv`` with those the checkpoint ``--load`` names fixes, checked
    (a ConfigError names the flag), with Megatron's derived values; the run reads them as
    a ``run_config.RunConfig``. ``--recipe NAME``: that recipe's values are the defaults."""
    recipe, argv = split_recipe(argv)
    parser = build_parser()
    if recipe is not None:
        recipe_defaults(parser, recipe)
    args = parser.parse_args(argv)
    given = given_flags(argv)
    apply_checkpoint_args(args, given)
    refuse_moe_flags_given_to_dense(args, given)
    return validate_args(args, world_size)


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
    from ..config.run_config import group_of_flags  # its groups are made from this parser

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
