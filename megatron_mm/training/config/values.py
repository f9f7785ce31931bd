"""A RunConfig from typed values ({flag dest: value}) instead of a command line: how the
Hugging Face converter states a model and how a checkpoint's saved flags decide one
(``--load``: Megatron-LM's --use-checkpoint-args, always on). Each value is checked against
its field (an on/off flag takes a bool, a choice one of its choices) and typed as the
parser types the word (an int given to a float flag is stored as a float, a list as a
list), so checkpoints save what the command line would; the other flags keep their
defaults. No command-line module, no torch import (the checkpoint's flags: only with
``--load``)."""

from __future__ import annotations

import dataclasses
import os
import typing
from typing import Any, Dict, Mapping, Optional

from ...config import ConfigError
from ...families import FAMILIES
from ...families.flags import FamilyFlags, flag_classes
from .groups import GROUP_CLASSES, CheckpointArgs, flag_fields, from_values
from .linear_attention_args import CHECKPOINT_FLAGS as LINEAR_ATTENTION_FLAGS
from .lora_args import LORA_FLAGS
from .run_config import RunConfig

# What a checkpoint's saved flags decide when --load names it: the architecture, its
# tokenizer and image processor.
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


def _flag_fields() -> Dict[str, dataclasses.Field]:
    fields = {}
    for cls in GROUP_CLASSES.values():
        for f in flag_fields(cls):
            if f.type not in ("FamilyFlags", FamilyFlags):
                fields[f.name] = f
    for cls in flag_classes():
        fields.update({f.name: f for f in dataclasses.fields(cls)})
    return fields


def _base(annotation):
    """``annotation`` without its Optional."""
    if typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def typed_value(f: dataclasses.Field, value: Any) -> Any:
    """``value`` as the parser stores it for ``f``'s flag (a ConfigError names the flag
    where it cannot take it)."""
    flag = "--" + f.name.replace("_", "-")
    kind, meta = _base(f.type), f.metadata.get("argparse_meta", {})
    if meta.get("choices") is not None and value not in meta["choices"]:
        raise ConfigError(f"{flag}: invalid choice: {value!r} (choose from "
                          f"{', '.join(map(repr, meta['choices']))})")
    if value is None or "type" in meta:
        return value  # a default None, or a flag with its own parser (read as given)
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{flag} is on or off (a bool), not {value!r}")
        return value
    if typing.get_origin(kind) in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{flag} takes a list of values, not {value!r}")
        element = (typing.get_args(kind) or (object,))[0]
        return [float(v) if element is float and isinstance(v, int) else v for v in value]
    if typing.get_origin(kind) is typing.Literal:
        if value not in typing.get_args(kind):
            raise ConfigError(f"{flag}: invalid choice: {value!r} (choose from "
                              f"{', '.join(map(repr, typing.get_args(kind)))})")
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind in (int, float, str) and (not isinstance(value, kind) or isinstance(value, bool)):
        raise ConfigError(f"{flag}: expected {kind.__name__}, got {value!r}")
    return value


def run_config_of(values: Mapping[str, Any],
                  saved: Optional[Mapping[str, Any]] = None) -> RunConfig:
    """The RunConfig of ``values`` ({dest: value}) with ``saved`` (``checkpoint_values``:
    as the checkpoint holds them) over them, every other flag at its default, unvalidated
    (``RunConfig.validated`` checks it)."""
    fields = _flag_fields()
    typed = {}
    for dest, value in values.items():
        if dest not in fields:
            raise ConfigError(f"no flag stores {dest!r}")
        typed[dest] = typed_value(fields[dest], value)
    typed.update(saved or {})
    return RunConfig(**{group: from_values(cls, typed) for group, cls in GROUP_CLASSES.items()})


def checkpoint_values(load: Optional[str], given: Mapping[str, Any],
                      checkpoint: Optional[CheckpointArgs] = None) -> Dict[str, Any]:
    """The flags the checkpoint in ``load`` decides (its architecture, tokenizer, image
    processor and LoRA adapters), as saved (paths made absolute, lists as tuples); a flag
    of ``given`` (the flags written, {dest: value}) that disagrees is a ConfigError. Empty
    without ``load`` or a readable checkpoint (its problems are reported on loading).
    ``checkpoint``: the run's checkpoint group (which iteration to read; default: the
    one of ``given``)."""
    if not load:
        return {}
    from ..checkpoint.checkpointing import CheckpointError, saved_args  # torch: only here

    try:
        saved = saved_args(checkpoint or from_values(CheckpointArgs, {**given, "load": load}))
    except CheckpointError:
        return {}
    out = {}
    for dest in CHECKPOINT_FLAGS:
        if dest not in saved:
            continue
        value = saved[dest]
        if dest in CHECKPOINT_PATH_FLAGS and value and not os.path.isabs(value):
            value = os.path.join(load, value)
        if isinstance(value, list):
            value = tuple(value)
        if dest in given:
            given_value = given[dest]
            if isinstance(given_value, list):  # nargs flags: compare as the saved tuple
                given_value = tuple(given_value)
            if given_value != value:
                flag = "--" + dest.replace("_", "-")
                raise ConfigError(f"{flag} {given[dest]} disagrees with the checkpoint in "
                                  f"--load {load} ({value}); drop the flag to use the "
                                  f"checkpoint's value")
        out[dest] = value
    if saved.get("lora_rank") is not None and "lora_rank" not in given:
        out.update({dest: saved[dest] for dest in LORA_FLAGS if dest in saved})
    return out
