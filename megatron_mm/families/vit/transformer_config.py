"""The CLIP / SigLIP layers' Megatron-Core ``TransformerConfig``."""

from __future__ import annotations

from megatron.core.activations import quick_gelu
from megatron.core.transformer.transformer_config import TransformerConfig

from ...models.fusions import partial_tanh_gelu
from ...models.transformer_configs import BuildSettings, encoder_transformer_config
from .config import VisionEncoderConfig


def vision_transformer_config(enc: VisionEncoderConfig, s: BuildSettings,
                              name: str = "vision") -> TransformerConfig:
    """LayerNorm, quick-GELU (CLIP) or tanh-GELU (SigLIP), biases everywhere."""
    activation = quick_gelu if enc.model_type == "clip" else partial_tanh_gelu
    return encoder_transformer_config(
        enc, s, name,
        kv_channels=enc.hidden_size // enc.num_attention_heads,
        normalization="LayerNorm",
        layernorm_epsilon=enc.layernorm_epsilon,
        gated_linear_unit=False,
        **s.activation(activation),
        add_bias_linear=True,
        add_qkv_bias=True,
    )
