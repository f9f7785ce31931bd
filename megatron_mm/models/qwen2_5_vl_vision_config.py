"""The Qwen2.5-VL vision encoder's config, and its Megatron-Core ``TransformerConfig``s.

Field names follow the package's (``num_layers``, ``ffn_hidden_size``); ``from_hf`` reads
Hugging Face's ``Qwen2_5_VLVisionConfig`` and refuses what this encoder does not implement
rather than dropping it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch.nn.functional as F
from megatron.core.transformer.transformer_config import TransformerConfig

from ..config import ConfigError
from .transformer_configs import BuildSettings


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


@dataclass
class Qwen2_5VLVisionConfig:
    """Defaults are Qwen2.5-VL-7B's vision tower. ``window_size`` is in pixels (Hugging
    Face's convention); ``fullatt_block_indexes`` are 0-based layer indices."""

    hidden_size: int = 1280
    num_layers: int = 32
    num_attention_heads: int = 16
    ffn_hidden_size: int = 3420
    out_hidden_size: int = 3584  # the LLM's hidden size: the merger's output
    patch_size: int = 14
    temporal_patch_size: int = 2
    in_channels: int = 3
    spatial_merge_size: int = 2
    window_size: int = 112
    fullatt_block_indexes: Tuple[int, ...] = (7, 15, 23, 31)
    rope_theta: float = 10000.0
    norm_epsilon: float = 1e-6
    flag_prefix: str = "--vision-"

    def __post_init__(self):
        p = self.flag_prefix
        self.fullatt_block_indexes = tuple(int(i) for i in self.fullatt_block_indexes)
        _require(self.hidden_size % self.num_attention_heads == 0,
                 f"{p}num-attention-heads {self.num_attention_heads} must divide "
                 f"{p}hidden-size {self.hidden_size}")
        _require(self.head_dim % 4 == 0,
                 f"the head dimension {self.head_dim} must be a multiple of 4: the 2-D "
                 "rotary embedding gives a quarter of it to each of (row, column) x (cos, sin)")
        _require(all(0 <= i < self.num_layers for i in self.fullatt_block_indexes),
                 f"{p}fullatt-block-indexes {list(self.fullatt_block_indexes)} must be "
                 f"layer indices in [0, {self.num_layers})")
        _require(self.window_size >= self.spatial_merge_size * self.patch_size,
                 f"{p}window-size {self.window_size} (pixels) must span at least one merge "
                 f"unit ({self.spatial_merge_size} x {self.patch_size} pixels)")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patch_input_size(self) -> int:
        """Values per patch: channels x temporal patch x patch x patch (1176 for Qwen)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merged_size(self) -> int:
        """Width of one merged token: a 2x2 unit of patches side by side."""
        return self.hidden_size * self.spatial_merge_size ** 2

    @classmethod
    def from_hf(cls, hf) -> "Qwen2_5VLVisionConfig":
        """From Hugging Face's ``Qwen2_5_VLVisionConfig``; a setting this encoder does not
        implement is an error naming the field."""
        act = getattr(hf, "hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"Qwen2.5-VL vision config hidden_act={act!r}: only 'silu' "
                              "(SwiGLU) is implemented")
        rope = getattr(hf, "rope_parameters", None) or {}
        if rope.get("rope_type", "axial") != "axial":
            raise ConfigError(f"Qwen2.5-VL vision config rope_parameters.rope_type="
                              f"{rope['rope_type']!r}: only 'axial' is implemented")
        return cls(hidden_size=hf.hidden_size, num_layers=hf.depth,
                   num_attention_heads=hf.num_heads, ffn_hidden_size=hf.intermediate_size,
                   out_hidden_size=hf.out_hidden_size, patch_size=hf.patch_size,
                   temporal_patch_size=hf.temporal_patch_size, in_channels=hf.in_channels,
                   spatial_merge_size=hf.spatial_merge_size, window_size=hf.window_size,
                   fullatt_block_indexes=tuple(hf.fullatt_block_indexes),
                   rope_theta=float(rope.get("rope_theta", 10000.0)))


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
        activation_func=F.silu,
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
