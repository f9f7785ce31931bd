"""The Megatron-Core ``TransformerConfig``s of InternVL's vision side (InternViT, pixel
shuffle, MLP projector); the config dataclass itself is torch-free (``config.py``).
"""

from __future__ import annotations

import torch.nn.functional as F
from megatron.core.transformer.transformer_config import TransformerConfig

from ...models.transformer_configs import (BuildSettings, encoder_transformer_config,
                                          mlp_projector_config)
from .config import NORM_TYPES, PROJECTOR_NORM_EPSILON, InternViTConfig

ACTIVATIONS = {"gelu": F.gelu}  # Hugging Face's ACT2FN["gelu"]: exact GELU


def internvit_transformer_config(enc: InternViTConfig, s: BuildSettings,
                                 name: str = "vision") -> TransformerConfig:
    """The ViT blocks: pre-norm LayerNorm or RMSNorm, GELU MLP with biases, QKV bias per
    config, q/k RMSNorm across all heads per config (``internvit.CrossHeadRMSNorm``).
    Only the layers the selected features need are built (``layers_run``)."""
    return encoder_transformer_config(
        enc, s, name, enc.layers_run,
        kv_channels=enc.head_dim,
        normalization=NORM_TYPES[enc.norm_type],
        layernorm_epsilon=enc.norm_epsilon,
        qk_layernorm=enc.qk_norm,
        gated_linear_unit=False,
        activation_func=ACTIVATIONS[enc.hidden_act],
        add_bias_linear=True,
        add_qkv_bias=enc.attention_bias,
    )


def internvl_projector_transformer_config(enc: InternViTConfig, s: BuildSettings,
                                          name: str = "vision") -> TransformerConfig:
    """The projector's MLP (a ``MultimodalProjector``): shuffled width -> LLM hidden
    (GELU) -> LLM hidden."""
    return mlp_projector_config(s, name, enc.out_hidden_size, enc.out_hidden_size,
                                enc.num_attention_heads, ACTIVATIONS[enc.projector_hidden_act],
                                layernorm_epsilon=PROJECTOR_NORM_EPSILON,
                                normalization="LayerNorm")
