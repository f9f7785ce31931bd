"""The Whisper layers' Megatron-Core ``TransformerConfig``."""

from __future__ import annotations

import torch.nn.functional as F
from megatron.core.transformer.transformer_config import TransformerConfig

from ...models.transformer_configs import BuildSettings, encoder_transformer_config
from .config import AudioEncoderConfig


def audio_transformer_config(enc: AudioEncoderConfig, s: BuildSettings,
                             name: str = "audio") -> TransformerConfig:
    """Whisper's layers: LayerNorm, exact GELU, biases (Whisper's key projection has none:
    a converter writes zeros there)."""
    return encoder_transformer_config(
        enc, s, name,
        kv_channels=enc.hidden_size // enc.num_attention_heads,
        normalization="LayerNorm",
        layernorm_epsilon=enc.layernorm_epsilon,
        gated_linear_unit=False,
        activation_func=F.gelu,
        add_bias_linear=True,
        add_qkv_bias=True,
    )
