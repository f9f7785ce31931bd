"""Qwen3.5 (``Qwen3_5ForConditionalGeneration``) for the converter: Qwen3-VL's tower and
final merger (no DeepStack) and the hybrid LLM's table (``hf_table.py``), flags from the
config (the layer pattern from ``layer_types``, GDN's sizes, gated attention, partial
rotary, zero-centred norms), and Qwen3-VL's ``compare`` inputs (its processor and M-RoPE
positions are Qwen3-VL's: timestamps between a clip's frames). Checkpoints name the LLM
``model.language_model.`` and the tower ``model.visual.``."""

from __future__ import annotations

from ...hf.config_fields import Field, one_of, refuse_unsupported
from ...hf.errors import ConversionError
from ...hf.families import Family, Flags, TextModel, language_flags
from ...hf.layouts import CAUSAL_LM
from ...hf.mapping import prefixed
from ...hf.tables import OUTPUT_LAYER
from ..qwen3_vl import hf as qwen3_vl
from ..qwen3_vl.hf_table import qwen3_vl_vision_rules
from .hf_table import hybrid_language_rules

ARCH = "Qwen3_5ForConditionalGeneration"
INPUTS = qwen3_vl.INPUTS
LAYER_TYPES = {"linear_attention": 1, "full_attention": 0}
# The published checkpoints' multi-token-prediction head (``mtp_num_hidden_layers``), which
# transformers does not load either: kept verbatim beside the checkpoint, written back on
# export.
UNUSED = (r"mtp\..*",)

# The hybrid decoder's own fields (the shared LLM fields: config_fields.language_fields).
TEXT_FIELDS = (
    Field("layer_types", lambda v, c: v is not None and len(v) == c.num_hidden_layers
          and set(v) <= set(LAYER_TYPES),
          "each layer is 'linear_attention' (Gated DeltaNet) or 'full_attention', one per "
          "layer (num_hidden_layers)"),
    Field("linear_num_value_heads",
          lambda v, c: v % c.linear_num_key_heads == 0,
          "the value heads are a multiple of the key heads (linear_num_key_heads): "
          "Megatron-Core's GDN repeats each key head over its value heads"),
    Field("rope_parameters.mrope_interleaved", one_of(True, None),
          "Qwen3.5's M-RoPE deals the frequencies to T, H, W in turn (interleaved); "
          "the sectioned kind is not this architecture", True),
)


def rules(hf_config):
    text, vision = hf_config.get_text_config(), hf_config.vision_config
    return (prefixed(hybrid_language_rules(text), "language_model.", "model.language_model.")
            + prefixed(OUTPUT_LAYER, "language_model.", "")
            + qwen3_vl_vision_rules("model.visual.", vision.in_channels,
                                    vision.temporal_patch_size, vision.patch_size, 0))


def hybrid_flags(text, where: str = "text_config.") -> Flags:
    """The hybrid LLM's own flags (beyond ``language_flags``)."""
    refuse_unsupported(text, TEXT_FIELDS, where)
    rope = dict(getattr(text, "rope_parameters", None) or {})
    return {"experimental_attention_variant": "gated_delta_net",
            "linear_attention_freq": [LAYER_TYPES[t] for t in text.layer_types],
            "linear_conv_kernel_dim": text.linear_conv_kernel_dim,
            "linear_key_head_dim": text.linear_key_head_dim,
            "linear_value_head_dim": text.linear_value_head_dim,
            "linear_num_key_heads": text.linear_num_key_heads,
            "linear_num_value_heads": text.linear_num_value_heads,
            "rotary_percent": float(rope.get("partial_rotary_factor", 1.0))}


def model_flags(hf_config) -> Flags:
    text, vision = hf_config.get_text_config(), hf_config.vision_config
    refuse_unsupported(vision, qwen3_vl.VISION_FIELDS, "vision_config.")
    if vision.out_hidden_size != text.hidden_size:
        raise ConversionError(f"config vision_config.out_hidden_size={vision.out_hidden_size}"
                              f" differs from text_config.hidden_size={text.hidden_size}: "
                              "the merger feeds the LLM")
    return {**language_flags(text, "text_config.",
                             tie_word_embeddings=hf_config.tie_word_embeddings),
            **hybrid_flags(text), **qwen3_vl.vision_flags(hf_config, deepstack=())}


# Qwen3.5's text model: q / k norms, gated attention, zero-centred norms, partial rotary by
# interleaved M-RoPE; transformers' split of the rotated frequencies when none is named.
TEXT_MODELS = {"qwen3_5_text": TextModel(
    flags=("qk_layernorm", "attention_output_gate", "apply_layernorm_1p"),
    mrope_section=(11, 11, 10), mrope_interleaved=True, partial_rotary=True)}

ARCHITECTURES = {ARCH: Family(
    ARCH, CAUSAL_LM, rules, True, unused=UNUSED, inputs=INPUTS, flags=model_flags,
    config_rules=True, media=qwen3_vl.megatron_media, positions=qwen3_vl.position_ids,
    hf_inputs=qwen3_vl.hf_inputs, file_flags=qwen3_vl.processor_flags)}
