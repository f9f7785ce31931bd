"""The Qwen3-VL vision encoder's Megatron-Core ``TransformerConfig``s: the tower's layers
and the mergers' MLPs."""

from __future__ import annotations

import torch.nn.functional as F
from megatron.core.transformer.transformer_config import TransformerConfig

from ...models.fusions import partial_tanh_gelu
from ...models.transformer_configs import (BuildSettings, encoder_transformer_config,
                                          mlp_projector_config)
from .config import Qwen3VLVisionConfig


def qwen3_vl_vision_transformer_config(enc: Qwen3VLVisionConfig, s: BuildSettings,
                                       name: str = "vision") -> TransformerConfig:
    """The ViT blocks: LayerNorm, tanh-GELU MLP, biases everywhere, full-width 2-D RoPE."""
    return encoder_transformer_config(
        enc, s, name, enc.num_layers,
        kv_channels=enc.head_dim,
        normalization="LayerNorm",
        layernorm_epsilon=enc.norm_epsilon,
        gated_linear_unit=False,
        **s.activation(partial_tanh_gelu),
        add_bias_linear=True,
        add_qkv_bias=True,
    )


def qwen3_vl_merger_transformer_config(enc: Qwen3VLVisionConfig, s: BuildSettings,
                                       name: str = "vision") -> TransformerConfig:
    """A patch merger's MLP (a ``MultimodalProjector``; the final merger and each DeepStack
    one): merged width -> merged width (exact GELU) -> ``out_hidden_size``; its LayerNorm
    (the DeepStack mergers' post-shuffle norm) from ``normalization``."""
    return mlp_projector_config(s, name, enc.out_hidden_size, enc.merged_size,
                                enc.num_attention_heads, F.gelu, normalization="LayerNorm",
                                layernorm_epsilon=enc.norm_epsilon)
