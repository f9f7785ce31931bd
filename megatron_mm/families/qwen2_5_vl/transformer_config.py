"""The Qwen2.5-VL vision encoder's config, and its Megatron-Core ``TransformerConfig``s.

Field names follow the package's (``num_layers``, ``ffn_hidden_size``); ``from_hf`` reads
Hugging Face's ``Qwen2_5_VLVisionConfig`` and refuses what this encoder does not implement
rather than dropping it.
"""

from __future__ import annotations

import torch.nn.functional as F
from megatron.core.transformer.transformer_config import TransformerConfig

from .config import Qwen2_5VLVisionConfig  # noqa: F401  (re-exported)
from ...models.transformer_configs import BuildSettings


def qwen2_5_vl_vision_transformer_config(enc: Qwen2_5VLVisionConfig, s: BuildSettings,
                                         name: str = "vision") -> TransformerConfig:
    """The ViT blocks: RMSNorm, SwiGLU with biases, QKV bias, full-width 2-D RoPE."""
    return TransformerConfig(
        num_layers=enc.num_layers,
        hidden_size=enc.hidden_size,
        ffn_hidden_size=enc.ffn_hidden_size,
        num_attention_heads=enc.num_attention_heads,
        kv_channels=enc.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=enc.norm_epsilon,
        gated_linear_unit=True,
        **s.activation(F.silu, gated=True),
        add_bias_linear=True,
        add_qkv_bias=True,
        **s.common(name),
        **s.fp8_fields(name),
    )


def qwen2_5_vl_merger_transformer_config(enc: Qwen2_5VLVisionConfig, s: BuildSettings,
                                         name: str = "vision") -> TransformerConfig:
    """The patch merger's MLP (a ``MultimodalProjector``): merged width -> merged width
    (exact GELU) -> ``out_hidden_size``. Attention fields only pass TP checks."""
    return TransformerConfig(
        num_layers=1,
        hidden_size=enc.out_hidden_size,
        ffn_hidden_size=enc.merged_size,
        num_attention_heads=enc.num_attention_heads,
        gated_linear_unit=False,
        activation_func=F.gelu,
        add_bias_linear=True,
        **s.common(),
        **s.fp8_fields(f"{name}-projector"),
    )
