"""The family's flags, as typed fields (their docstrings are the --help text)."""

from dataclasses import dataclass
from typing import List, Optional
from ..flags import flag


@dataclass(frozen=True)
class Qwen3VLFlags:
    """Qwen3-VL's own vision flags: DeepStack, the learned position table, video frame sampling
    (the rest are ``Qwen2_5VLFlags``)."""

    vision_deepstack_visual_indexes: Optional[List[int]] = flag(None, nargs="*")
    """qwen3_vl: 0-based tower layers whose outputs, each through its own merger, are added to the
    LLM's hidden state after its first layers (one LLM layer each; default 8 16 24, those below
    the last layer; the flag with no value: no DeepStack, Qwen3.5's tower)"""
    vision_num_position_embeddings: int = 2304
    """qwen3_vl: rows of the learned position table (a square), resized to each image's grid"""
    video_fps: float = 2.0
    """qwen3_vl: video frames sampled per second of each clip (of the frames a record gives at its
    own fps)"""
    video_num_frames: Optional[int] = None
    """qwen3_vl: sample this many frames of each clip instead"""
    video_min_frames: int = 4
    """qwen3_vl: sample at least this many frames (at most the clip's)"""
    video_max_frames: int = 768
    """qwen3_vl: sample at most this many frames"""
