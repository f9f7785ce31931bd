"""Qwen3-VL's media processors: Qwen2.5-VL's (images and videos at about their own size,
exact placeholder counts from headers and the resize rule) on Qwen3-VL's geometry, with
Qwen3-VL's M-RoPE positions (every video frame an item of its own).

Not yet Qwen3-VL's own video text: its processor writes a ``<t seconds>`` timestamp and the
vision tags before each frame; a ``<video>`` placeholder here expands to one run of all the
frames' tokens (positions still per frame)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...plan.costs.flops import attention_pair_share
from ..encoder import encoder_transformer
from ..qwen2_5_vl.media import QwenVLProcessorConfig
from ..qwen2_5_vl.media_processor import (QwenVLImageProcessor, QwenVLVideoProcessor,
                                          qwen_vl_statistics)
from .mrope_positions import qwen3_vl_sample_positions


@dataclass
class Qwen3VLImageProcessor(QwenVLImageProcessor):
    """Images as Qwen2.5-VL's; each sample's positions by Qwen3-VL's rule."""

    def position_ids(self, ids: list[int], media: dict, media_token_id, where: str
                     ) -> torch.Tensor:
        pos, _ = qwen3_vl_sample_positions(
            ids, image_token_id=media_token_id("image"),
            video_token_id=media_token_id("video"),
            image_grid_thw=media["image_grid_thw"].tolist(),
            video_grid_thw=media["video_grid_thw"].tolist(),
            spatial_merge_size=self.cfg.geometry.merge_size, context=where)
        return torch.from_numpy(pos).long()


def qwen3_vl_processor(model, enc) -> tuple:
    """The family's media processors (``model``: the run's model group); pixel statistics
    from ``--image-processor-config`` when given, else Qwen's defaults."""
    from .encoder import geometry

    stats = qwen_vl_statistics(model.image_processor_config) \
        if model.image_processor_config else {}
    cfg = QwenVLProcessorConfig(geometry=geometry(enc), **stats)
    # every layer attends within whole frames: vision work quadratic in each frame's patches
    share = attention_pair_share(encoder_transformer(enc, enc.num_layers))
    return (Qwen3VLImageProcessor(cfg, tokens_per_second=1.0, frame_attention=share),
            QwenVLVideoProcessor(cfg, frame_attention=share))
