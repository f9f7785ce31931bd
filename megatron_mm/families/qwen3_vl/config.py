"""The Qwen3-VL vision encoder's config (torch-free: the family registry, the planner and
the argument parser read it before any process group exists).

Field names follow the package's (``num_layers``, ``ffn_hidden_size``); the converter
(``hf.py``) maps Hugging Face's ``Qwen3VLVisionConfig`` onto flags and refuses what this
encoder does not implement. The processor's pixel bounds are part of the config: they fix
every item's token count, so a checkpoint carries them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

from ...config import require
from ..qwen2_5_vl.config import PatchShape


@dataclass
class Qwen3VLVisionConfig(PatchShape):
    """Defaults are Qwen3-VL-8B's vision tower and processor. ``deepstack_visual_indexes``:
    0-based tower layers whose outputs, each through its own merger, are added to the
    LLM's hidden state after its first ``len(deepstack_visual_indexes)`` layers."""

    model_type: str = "qwen3_vl"
    hidden_size: int = 1152
    num_layers: int = 27
    num_attention_heads: int = 16
    ffn_hidden_size: int = 4304
    out_hidden_size: int = 4096  # the LLM's hidden size: the mergers' output
    patch_size: int = 16
    temporal_patch_size: int = 2
    in_channels: int = 3
    spatial_merge_size: int = 2
    num_position_embeddings: int = 2304  # a square table, bilinearly resized per grid
    deepstack_visual_indexes: Tuple[int, ...] = (8, 16, 24)
    rope_theta: float = 10000.0
    norm_epsilon: float = 1e-6
    min_pixels: int = 65536
    max_pixels: int = 16777216
    video_min_pixels: int = 128 * 32 * 32
    video_max_pixels: int = 768 * 32 * 32
    # Qwen3VLVideoProcessor's frame sampling (video.py)
    video_fps: float = 2.0
    video_num_frames: Optional[int] = None
    video_min_frames: int = 4
    video_max_frames: int = 768
    flag_prefix: str = "--vision-"

    def __post_init__(self):
        p = self.flag_prefix
        self.deepstack_visual_indexes = tuple(int(i) for i in self.deepstack_visual_indexes)
        require(self.model_type == "qwen3_vl",
                f"{p}model-type must be qwen3_vl, got {self.model_type!r}")
        require(self.hidden_size % self.num_attention_heads == 0,
                f"{p}num-attention-heads {self.num_attention_heads} must divide "
                f"{p}hidden-size {self.hidden_size}")
        require(self.head_dim % 4 == 0,
                f"the head dimension {self.head_dim} must be a multiple of 4: the 2-D "
                "rotary embedding gives a quarter of it to each of (row, column) x (cos, sin)")
        require(all(0 <= i < self.num_layers for i in self.deepstack_visual_indexes),
                f"{p}deepstack-visual-indexes {list(self.deepstack_visual_indexes)} must be "
                f"layer indices in [0, {self.num_layers})")
        require(len(set(self.deepstack_visual_indexes)) == len(self.deepstack_visual_indexes),
                f"{p}deepstack-visual-indexes {list(self.deepstack_visual_indexes)} repeat a "
                "layer")
        require(math.isqrt(self.num_position_embeddings) ** 2 == self.num_position_embeddings,
                f"{p}num-position-embeddings {self.num_position_embeddings} must be a square "
                "(the learned position table is side x side)")
        require(0 < self.min_pixels <= self.max_pixels,
                f"--min-pixels {self.min_pixels} must be positive and at most --max-pixels "
                f"{self.max_pixels}")
        require(self.video_fps > 0, f"--video-fps {self.video_fps} must be positive")
        require(self.video_num_frames is None or self.video_num_frames > 0,
                f"--video-num-frames {self.video_num_frames} must be positive")
        require(0 < self.video_min_frames <= self.video_max_frames,
                f"--video-min-frames {self.video_min_frames} must be positive and at most "
                f"--video-max-frames {self.video_max_frames}")
        require(0 < self.video_min_pixels <= self.video_max_pixels,
                f"--video-min-pixels {self.video_min_pixels} must be positive and at most "
                f"--video-max-pixels {self.video_max_pixels}")

    @property
    def num_layers_built(self) -> int:
        return self.num_layers

    @property
    def num_output_tokens(self):
        """None: every item hands the LLM its own count (from its grid)."""
        return None

    @property
    def deepstack_llm_layers(self) -> int:
        """LLM layers (the first ones) that add DeepStack features."""
        return len(self.deepstack_visual_indexes)

    @property
    def position_side(self) -> int:
        return math.isqrt(self.num_position_embeddings)
