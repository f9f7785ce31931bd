"""Qwen3-VL's media processors, as ``Qwen3VLProcessor`` lays a sample out.

Images are Qwen2.5-VL's processor (``Qwen2VLImageProcessor``) on Qwen3-VL's geometry
(16 px patches, 32 px merge units) and statistics (mean and std 0.5). A video keeps the
frames ``video.py``'s sampling picks, resized by Qwen3-VL's rule, and expands to one run a
temporal patch, each after its ``<t seconds>`` text and between its own vision tags, with
no pair around the whole clip (``ItemRuns``: the released processor replaces the chat
template's ``<|vision_start|><|video_pad|><|vision_end|>`` by the runs). Positions are
Qwen3-VL's M-RoPE (every temporal patch an item of its own)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...data.media import image_size, load_image, to_rgb
from ...data.processing import ItemRuns
from ...data.records import DataRecordError, MediaRef
from ...plan.costs.flops import attention_pair_share
from ..encoder import encoder_transformer
from ..errors import MediaGeometryError
from ..qwen2_5_vl.media import QwenVLProcessorConfig, normalised, patchify
from ..qwen2_5_vl.media_processor import (QwenVLImageProcessor, QwenVLPatches,
                                          qwen_vl_statistics)
from .mrope_positions import qwen3_vl_sample_positions
from .video import VideoPlan, VideoSampling, plan_video

# Qwen3-VL's preprocessor_config.json (image_mean, image_std).
QWEN3_VL_MEAN = QWEN3_VL_STD = (0.5, 0.5, 0.5)


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


@dataclass
class Qwen3VLVideoProcessor(QwenVLPatches):
    """Videos (``MediaRef.frames`` at ``MediaRef.fps``): sampled, resized, patchified."""

    cfg: QwenVLProcessorConfig
    sampling: VideoSampling
    modality: str = "video"
    frame_attention: float = 0.0  # the vision work's (QwenVLPatches.vision_work)

    def plan(self, ref: MediaRef, where: str) -> VideoPlan:
        """The clip's frames, size, grid and text, from its first frame's header."""
        what = f"{where} video ({ref.describe()})"
        if ref.frames is None:
            raise DataRecordError(f"{where}: a video needs 'frames' and 'fps'")
        h, w = image_size(ref.frames[0], f"{where} video frame 0")
        try:
            return plan_video(len(ref.frames), h, w, ref.fps, self.cfg.geometry,
                              self.sampling, what)
        except MediaGeometryError as e:
            raise DataRecordError(str(e)) from None

    def token_count(self, ref: MediaRef, where: str) -> ItemRuns:
        """One run a temporal patch, after its timestamp."""
        plan = self.plan(ref, where)
        m = self.cfg.geometry.merge_size
        per_frame = plan.grid[1] * plan.grid[2] // (m * m)
        return ItemRuns(tuple((text, per_frame) for text in plan.timestamps))

    def grid(self, ref: MediaRef, where: str) -> tuple:
        return tuple(self.plan(ref, where).grid)

    def load(self, refs: list[MediaRef], where: str) -> dict[str, torch.Tensor]:
        geo = self.cfg.geometry
        rows, grids = [], []
        for i, ref in enumerate(refs):
            plan = self.plan(ref, f"{where} video {i}")
            frames = [to_rgb(load_image(ref.frames[j], context=f"{where} video {i} frame {j}"),
                             f"{where} video {i} frame {j}") for j in plan.indices]
            if len({f.size for f in frames}) > 1:
                raise DataRecordError(
                    f"{where} video {i}: all frames must have one size, got "
                    f"{sorted({f'{w}x{h}' for w, h in (f.size for f in frames)})} "
                    "(width x height)")
            x = np.stack([normalised(f, plan.size, self.cfg) for f in frames])
            if len(x) % geo.temporal_patch_size:  # transformers repeats the last frame
                pad = -len(x) % geo.temporal_patch_size
                x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
            r, grid = patchify(x, geo)
            rows.append(r)
            grids.append(grid)
        width = 3 * geo.temporal_patch_size * geo.patch_size ** 2
        return {"video": torch.from_numpy(np.concatenate(rows)) if rows
                else torch.empty(0, width),
                "video_grid_thw": torch.tensor(grids, dtype=torch.long).reshape(-1, 3)}


def qwen3_vl_processor(model, enc) -> tuple:
    """The family's media processors (``model``: the run's model group); pixel statistics
    from ``--image-processor-config`` when given, else Qwen3-VL's."""
    from .encoder import geometry, video_sampling

    stats = qwen_vl_statistics(model.image_processor_config) \
        if model.image_processor_config else dict(mean=QWEN3_VL_MEAN, std=QWEN3_VL_STD)
    cfg = QwenVLProcessorConfig(geometry=geometry(enc), **stats)
    # every layer attends within whole frames: vision work quadratic in each frame's patches
    share = attention_pair_share(encoder_transformer(enc, enc.num_layers))
    return (Qwen3VLImageProcessor(cfg, tokens_per_second=1.0, frame_attention=share),
            Qwen3VLVideoProcessor(cfg, video_sampling(enc), frame_attention=share))
