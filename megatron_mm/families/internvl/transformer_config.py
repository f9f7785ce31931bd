"""The Megatron-Core ``TransformerConfig``s of InternVL's vision side (InternViT, pixel
shuffle, MLP projector). The config dataclass itself is torch-free
(``families/internvl/config.py``), re-exported here.
"""

from __future__ import annotations

import torch.nn.functional as F
from megatron.core.transformer.transformer_config import TransformerConfig

from .config import (  # noqa: F401  (re-exported)
    NORM_TYPES,
    PROJECTOR_NORM_EPSILON,
    QK_NORM_EPSILON,
    InternViTConfig,
)
from ...models.transformer_configs import BuildSettings

ACTIVATIONS = {"gelu": F.gelu}  # Hugging Face's ACT2FN["gelu"]: exact GELU


def internvit_transformer_config(enc: InternViTConfig, s: BuildSettings,
                                 name: str = "vision") -> TransformerConfig:
    """The ViT blocks: pre-norm LayerNorm or RMSNorm, GELU MLP with biases, QKV bias per
    config, q/k RMSNorm across all heads per config (``internvit.CrossHeadRMSNorm``).
    Only the layers the selected features need are built (``layers_run``)."""
    return TransformerConfig(
        num_layers=enc.layers_run,
        hidden_size=enc.hidden_size,
        ffn_hidden_size=enc.ffn_hidden_size,
        num_attention_heads=enc.num_attention_heads,
        kv_channels=enc.head_dim,
        normalization=NORM_TYPES[enc.norm_type],
        layernorm_epsilon=enc.norm_epsilon,
        qk_layernorm=enc.qk_norm,
        gated_linear_unit=False,
        activation_func=ACTIVATIONS[enc.hidden_act],
        add_bias_linear=True,
        add_qkv_bias=enc.attention_bias,
        **s.common(name),
        **s.fp8_fields(name),
    )


def internvl_projector_transformer_config(enc: InternViTConfig, s: BuildSettings,
                                          name: str = "vision") -> TransformerConfig:
    """The projector's MLP (a ``MultimodalProjector``): shuffled width -> LLM hidden
    (GELU) -> LLM hidden. Attention fields only pass TP checks."""
    return TransformerConfig(
        num_layers=1,
        hidden_size=enc.out_hidden_size,
        ffn_hidden_size=enc.out_hidden_size,
        num_attention_heads=enc.num_attention_heads,
        gated_linear_unit=False,
        activation_func=ACTIVATIONS[enc.projector_hidden_act],
        add_bias_linear=True,
        layernorm_epsilon=PROJECTOR_NORM_EPSILON,
        normalization="LayerNorm",
        **s.common(),
        **s.fp8_fields(f"{name}-projector"),
    )
