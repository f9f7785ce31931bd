"""Qwen2-Audio (the Whisper encoder pooled by 2 + one Linear + Qwen2) for the converter:
on-disk layout, config-field rules, flags and the architecture's record."""

from __future__ import annotations

from ...hf.config_fields import Field, one_of, refuse_unsupported
from ...hf.families import Family, Flags, language_flags
from ...hf.layouts import Layout
from .hf_table import qwen2_audio_rules

# Qwen2-Audio (hf-offline notes, section 3): hub files use the legacy prefixes.
QWEN2_AUDIO = Layout(
    aliases=(
        ("language_model.model.", "model.language_model."),
        ("language_model.lm_head.", "lm_head."),
        ("audio_tower.", "model.audio_tower."),
        ("multi_modal_projector.", "model.multi_modal_projector."),
    ),
    export=(
        ("model.language_model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
        ("model.audio_tower.", "audio_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    ),
)

AUDIO_FIELDS = (
    Field("activation_function", one_of("gelu"), "Whisper's MLP uses exact 'gelu'"),
    Field("scale_embedding", one_of(False),
          "the audio encoder does not scale its input by sqrt(d_model)", False),
)


def audio_flags(hf_config) -> Flags:
    audio = hf_config.audio_config
    refuse_unsupported(audio, AUDIO_FIELDS, "audio_config.")
    return {"vision_model_type": "none", "audio_model_type": "whisper",
            "audio_hidden_size": audio.d_model, "audio_num_layers": audio.encoder_layers,
            "audio_num_attention_heads": audio.encoder_attention_heads,
            "audio_ffn_hidden_size": audio.encoder_ffn_dim,
            "audio_num_mel_bins": audio.num_mel_bins,
            "audio_max_source_positions": audio.max_source_positions,
            "audio_pool_stride": 2, "audio_norm_epsilon": 1e-5,  # nn.LayerNorm's
            "audio_projector_type": "affine", "audio_token_id": hf_config.audio_token_id}


def qwen2_audio_flags(hf_config) -> Flags:
    return {**language_flags(hf_config.get_text_config(), "text_config."),
            **audio_flags(hf_config)}


ARCHITECTURES = {f.architecture: f for f in (
    Family("Qwen2AudioForConditionalGeneration", QWEN2_AUDIO, qwen2_audio_rules, True,
           inputs=("input_ids", "attention_mask", "input_features",
                   "feature_attention_mask"), flags=qwen2_audio_flags),
)}
