"""Qwen3-VL's 3-D M-RoPE position ids, on the host (numpy, no torch).

transformers' ``Qwen3VLModel.get_rope_index`` is Qwen2.5-VL's rule with every video frame
(temporal patch) an item of its own: the video grid (t, h, w) becomes t grids (1, h, w)
(its processor writes a ``<t seconds>`` timestamp and the vision tags between frames), so a
frame at position s gets (s, s + row, s + col), and text continues at s + max(h, w) / merge
after each frame. Time is told by the timestamp text, not by temporal positions.
"""

from __future__ import annotations

import numpy as np

from ..qwen2_5_vl.mrope_positions import _grid_list, batch_mrope_positions, sample_mrope_positions


def frame_grids(video_grid_thw) -> list:
    """Each video's grid (t, h, w) as t frame grids (1, h, w), in order."""
    return [(1, h, w) for t, h, w in _grid_list(video_grid_thw) for _ in range(t)]


def qwen3_vl_sample_positions(input_ids, *, image_token_id: int, video_token_id: int,
                              image_grid_thw=None, video_grid_thw=None, attention_mask=None,
                              spatial_merge_size: int = 2,
                              context: str = "sample") -> tuple[np.ndarray, int]:
    """Positions [3, S] and the generation delta of one sample."""
    return sample_mrope_positions(
        input_ids, image_token_id=image_token_id, video_token_id=video_token_id,
        image_grid_thw=image_grid_thw, video_grid_thw=frame_grids(video_grid_thw) or None,
        attention_mask=attention_mask, spatial_merge_size=spatial_merge_size,
        tokens_per_second=1.0, context=context)  # one temporal patch per frame: no time


def qwen3_vl_batch_positions(input_ids, *, image_token_id: int, video_token_id: int,
                             image_grid_thw=None, video_grid_thw=None, attention_mask=None,
                             spatial_merge_size: int = 2,
                             context: str = "batch") -> tuple[np.ndarray, np.ndarray]:
    """Positions [3, B, S] and deltas [B, 1] of a batch (grids of all rows in order)."""
    return batch_mrope_positions(
        input_ids, image_token_id=image_token_id, video_token_id=video_token_id,
        image_grid_thw=image_grid_thw, video_grid_thw=frame_grids(video_grid_thw) or None,
        attention_mask=attention_mask, spatial_merge_size=spatial_merge_size,
        tokens_per_second=1.0, context=context)
