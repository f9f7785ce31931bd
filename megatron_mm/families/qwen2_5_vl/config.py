"""The Qwen2.5-VL vision encoder's config (torch-free: the family registry, the planner and
the argument parser read it before any process group exists).

Field names follow the package's (``num_layers``, ``ffn_hidden_size``); ``from_hf`` reads
Hugging Face's ``Qwen2_5_VLVisionConfig`` and refuses what this encoder does not implement
rather than dropping it. The processor geometry (pixel bounds) is part of the config: it
fixes every item's token count, so a checkpoint carries it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from ...config import ConfigError, require


class PatchShape:
    """The patch and merge shapes of a native-resolution Qwen ViT config (Qwen2.5-VL's and
    Qwen3-VL's share them): fields ``hidden_size``, ``num_attention_heads``, ``in_channels``,
    ``patch_size``, ``temporal_patch_size``, ``spatial_merge_size``."""

    @property
    def merge_unit(self) -> int:
        """Patches per LLM token: a spatial_merge_size x spatial_merge_size unit."""
        return self.spatial_merge_size ** 2

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
        return self.hidden_size * self.merge_unit


@dataclass
class Qwen2_5VLVisionConfig(PatchShape):
    """Defaults are Qwen2.5-VL-7B's vision tower. ``window_size`` is in pixels (Hugging
    Face's convention); ``fullatt_block_indexes`` are 0-based layer indices. The pixel
    bounds are the processor's (``min_pixels`` ... for images, ``video_*`` for frames)."""

    model_type: str = "qwen2_5_vl"
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
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    video_min_pixels: int = 128 * 28 * 28
    video_max_pixels: int = 28 * 28 * 768
    tokens_per_second: Optional[float] = None  # M-RoPE time scale of video (the LLM's)
    flag_prefix: str = "--vision-"

    def __post_init__(self):
        p = self.flag_prefix
        self.fullatt_block_indexes = tuple(int(i) for i in self.fullatt_block_indexes)
        require(self.hidden_size % self.num_attention_heads == 0,
                 f"{p}num-attention-heads {self.num_attention_heads} must divide "
                 f"{p}hidden-size {self.hidden_size}")
        require(self.head_dim % 4 == 0,
                 f"the head dimension {self.head_dim} must be a multiple of 4: the 2-D "
                 "rotary embedding gives a quarter of it to each of (row, column) x (cos, sin)")
        require(all(0 <= i < self.num_layers for i in self.fullatt_block_indexes),
                 f"{p}fullatt-block-indexes {list(self.fullatt_block_indexes)} must be "
                 f"layer indices in [0, {self.num_layers})")
        require(self.model_type == "qwen2_5_vl",
                 f"{p}model-type must be qwen2_5_vl, got {self.model_type!r}")
        require(0 < self.min_pixels <= self.max_pixels,
                 f"--min-pixels {self.min_pixels} must be positive and at most --max-pixels "
                 f"{self.max_pixels}")
        require(0 < self.video_min_pixels <= self.video_max_pixels,
                 f"--video-min-pixels {self.video_min_pixels} must be positive and at most "
                 f"--video-max-pixels {self.video_max_pixels}")
        require(self.window_size >= self.spatial_merge_size * self.patch_size,
                 f"{p}window-size {self.window_size} (pixels) must span at least one merge "
                 f"unit ({self.spatial_merge_size} x {self.patch_size} pixels)")

    @property
    def num_layers_built(self) -> int:
        return self.num_layers

    @property
    def num_output_tokens(self) -> Optional[int]:
        """None: every item hands the LLM its own count (from its grid)."""
        return None

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


