"""The model config (``config.MultimodalModelConfig``) a run's model group describes: the
language model, each slot's encoder (its family builds the config from the same group),
projectors and what is frozen. No torch import."""

from __future__ import annotations

import dataclasses

from ...config import (
    ConfigError,
    FreezeConfig,
    LanguageModelConfig,
    MultimodalModelConfig,
    ProjectorConfig,
    YarnConfig,
)
from ...families import SLOTS, family
from .linear_attention_args import linear_attention_config
from .moe_args import moe_config


def build_model_config(model, moe=None) -> MultimodalModelConfig:
    """The model config of the run's model group (``ModelArgs``), each encoder's from its
    family's ``from_model_args`` (the vocabulary is set once the tokenizer loads); ``moe``:
    the moe group (``MoeArgs``; None: a dense LLM)."""
    language = LanguageModelConfig(
        vocab_size=0,  # set from the tokenizer once it is loaded
        hidden_size=model.hidden_size,
        num_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_query_groups,
        ffn_hidden_size=model.ffn_hidden_size,
        kv_channels=model.kv_channels,
        seq_length=model.seq_length,
        max_position_embeddings=model.max_position_embeddings,
        rotary_base=model.rotary_base,
        position_embedding_type=model.position_embedding_type,
        mrope_section=None if model.mrope_section is None else tuple(model.mrope_section),
        mrope_interleaved=model.mrope_interleaved,
        rope_scaling=model.use_rope_scaling,
        rope_scaling_factor=model.rope_scaling_factor,
        yarn=yarn_config(model),
        add_qkv_bias=model.add_qkv_bias,
        qk_layernorm=model.qk_layernorm,
        untie_embeddings_and_output_weights=model.untie_embeddings_and_output_weights,
        norm_epsilon=model.norm_epsilon,
        make_vocab_size_divisible_by=model.make_vocab_size_divisible_by,
        moe=moe_config(moe, model),
        rotary_percent=model.rotary_percent,
        attention_output_gate=model.attention_output_gate,
        apply_layernorm_1p=model.apply_layernorm_1p,
        linear_attention=linear_attention_config(model),
    )
    encoders, projectors = {}, {}
    for slot in SLOTS:  # vision first: the chain's (and checkpoints') encoder order
        model_type = getattr(model, f"{slot}_model_type")
        if model_type == "none":
            continue
        encoders[slot] = family(model_type).from_model_args(model)
        own_type = getattr(model, f"{slot}_projector_type", None)
        projectors[slot] = ProjectorConfig(own_type or model.projector_type,
                                           model.projector_ffn_hidden_size)
    frozen = set()
    for slot, flag in SLOTS.items():
        if getattr(model, flag):
            if slot not in encoders:
                article = "an" if slot[0] in "aeiou" else "a"
                raise ConfigError(f"--{flag.replace('_', '-')} needs {article} {slot} encoder "
                                  f"(--{slot}-model-type)")
            frozen.add(slot)
    freeze = FreezeConfig(
        language_model=model.freeze_LM,
        encoders=frozen,
        projectors=set(encoders) if model.freeze_projector else set(),
    )
    return MultimodalModelConfig(
        encoders=encoders, projectors=projectors, language=language, freeze=freeze)


def yarn_config(model) -> YarnConfig:
    """YaRN's settings: the flags given (Megatron-LM leaves the ``--yarn-*`` flags at None
    for Megatron-Core's defaults)."""
    values = {f.name: getattr(model, f.name) for f in dataclasses.fields(YarnConfig)}
    return YarnConfig(**{name: v for name, v in values.items() if v is not None})
