"""The family's flags, as typed fields (their docstrings are the --help text)."""

from dataclasses import dataclass
from typing import List, Optional


@dataclass(frozen=True)
class Qwen2_5VLFlags:
    """Qwen2.5-VL's vision tower flags: window attention, the native-resolution processor's pixel
    bounds and merge; the qwen3_vl family shares them."""

    vision_window_size: int = 112
    """qwen2_5_vl: window attention's window side in pixels"""
    vision_fullatt_block_indexes: Optional[List[int]] = None
    """qwen2_5_vl: 0-based layers attending over the whole frame (default: every 8th layer's last,
    7 15 23 31 for 32 layers; the last layer with fewer than 8)"""
    vision_spatial_merge_size: int = 2
    """qwen2_5_vl: patches per side merged into one LLM token"""
    vision_temporal_patch_size: int = 2
    """qwen2_5_vl: video frames per patch (an image repeats its frame)"""
    vision_rope_theta: float = 10000.0
    """qwen2_5_vl: base of the 2-D rotary embedding"""
    vision_tokens_per_second: float = 2.0
    """qwen2_5_vl: M-RoPE temporal positions per second of video"""
    min_pixels: int = 56 * 56
    """qwen2_5_vl: images are resized to at least this area"""
    max_pixels: int = 28 * 28 * 1280
    """qwen2_5_vl: images are resized to at most this area"""
    video_min_pixels: int = 128 * 28 * 28
    """qwen2_5_vl: video frames are resized to at least this area"""
    video_max_pixels: int = 28 * 28 * 768
    """qwen2_5_vl: video frames are resized to at most this area"""
