"""The Qwen2.5-VL vision encoder's config, and its Megatron-Core ``TransformerConfig``s.

Field names follow the package's (``num_layers``, ``ffn_hidden_size``); ``from_hf`` reads
Hugging Face's ``Qwen2_5_VLVisionConfig`` and refuses what this encoder does not implement
rather than dropping it.
"""

from __future__ import annotations

import torch.nn.functional as F
from megatron.core.transformer.transformer_config import TransformerConfig

from ...models.transformer_configs import (BuildSettings, encoder_transformer_config,
                                          mlp_projector_config)
from .config import Qwen2_5VLVisionConfig


def qwen2_5_vl_vision_transformer_config(enc: Qwen2_5VLVisionConfig, s: BuildSettings,
                                         name: str = "vision") -> TransformerConfig:
    """The ViT blocks: RMSNorm, SwiGLU with biases, QKV bias, full-width 2-D RoPE."""
    return encoder_transformer_config(
        enc, s, name, enc.num_layers,
        kv_channels=enc.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=enc.norm_epsilon,
        gated_linear_unit=True,
        **s.activation(F.silu, gated=True),
        add_bias_linear=True,
        add_qkv_bias=True,
    )


def qwen2_5_vl_merger_transformer_config(enc: Qwen2_5VLVisionConfig, s: BuildSettings,
                                         name: str = "vision") -> TransformerConfig:
    """The patch merger's MLP (a ``MultimodalProjector``): merged width -> merged width
    (exact GELU) -> ``out_hidden_size``."""
    return mlp_projector_config(s, name, enc.out_hidden_size, enc.merged_size,
                                enc.num_attention_heads, F.gelu)
