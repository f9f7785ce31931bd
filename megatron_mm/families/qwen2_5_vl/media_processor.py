"""Qwen2.5-VL's media processors: images and videos at (about) their own size, each
item's placeholder count from its header and the resize rule, and each sample's M-RoPE
positions."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...data.media import image_size, load_image
from ...data.records import DataRecordError, MediaRef
from .geometry import MediaGeometryError, image_grid, num_placeholder_tokens, video_grid
from .media import QwenVLProcessorConfig, process_media
from .mrope_positions import sample_mrope_positions


class QwenVLPatches:
    """What Qwen2.5-VL's image and video processors share."""

    def token_count(self, ref: MediaRef, where: str) -> int:
        return num_placeholder_tokens(self.grid(ref, where), self.cfg.geometry.merge_size)

    def vision_work(self, ref: MediaRef, where: str) -> int:
        """Patches through the encoder (the data balancer's vision work), plus the core
        attention of a tower whose every layer attends within whole frames (Qwen3-VL):
        ``frame_attention`` patches' work per query-key pair, quadratic in each frame's
        patches. 0 (Qwen2.5-VL): its windows keep attention about linear in the patches."""
        t, h, w = self.grid(ref, where)
        return round(t * h * w + self.frame_attention * t * (h * w) ** 2)


@dataclass
class QwenVLImageProcessor(QwenVLPatches):
    """Qwen2.5-VL images at (about) their own size: patch rows and grids (t, h, w), each
    item's placeholder count from its header and the resize rule. Also fills each sample's
    M-RoPE positions (``position_ids``), from the grids of its images and videos."""

    cfg: QwenVLProcessorConfig
    tokens_per_second: float
    modality: str = "image"
    frame_attention: float = 0.0

    def grid(self, ref: MediaRef, where: str) -> tuple:
        h, w = image_size(ref, where)
        try:
            return image_grid(h, w, self.cfg.geometry, f"{where} image {ref.describe()}")
        except MediaGeometryError as e:
            raise DataRecordError(str(e)) from None

    def load(self, refs: list[MediaRef], where: str) -> dict[str, torch.Tensor]:
        if not refs:
            return {"image": torch.empty(0, _patch_width(self.cfg)),
                    "image_grid_thw": torch.empty(0, 3, dtype=torch.long)}
        images = [load_image(r, context=f"{where} image {i}") for i, r in enumerate(refs)]
        out = process_media(images=images, cfg=self.cfg, context=where)
        return {"image": out.pixel_values, "image_grid_thw": out.image_grid_thw}

    def position_ids(self, ids: list[int], media: dict, media_token_id, where: str
                     ) -> torch.Tensor:
        """[3, S] positions of a sample (``media``: its loaded media, every key)."""
        pos, _ = sample_mrope_positions(
            ids, image_token_id=media_token_id("image"),
            video_token_id=media_token_id("video"),
            image_grid_thw=media["image_grid_thw"].tolist(),
            video_grid_thw=media["video_grid_thw"].tolist(),
            second_per_grid_ts=media["second_per_grid_ts"].tolist(),
            spatial_merge_size=self.cfg.geometry.merge_size,
            tokens_per_second=self.tokens_per_second, context=where)
        return torch.from_numpy(pos).long()


@dataclass
class QwenVLVideoProcessor(QwenVLPatches):
    """Qwen2.5-VL videos: each a list of frames with an fps (``MediaRef.frames``)."""

    cfg: QwenVLProcessorConfig
    modality: str = "video"
    frame_attention: float = 0.0

    def grid(self, ref: MediaRef, where: str) -> tuple:
        if ref.frames is None:
            raise DataRecordError(f"{where}: a video needs 'frames' and 'fps'")
        h, w = image_size(ref.frames[0], f"{where} video frame 0")
        try:
            return video_grid(len(ref.frames), h, w, self.cfg.geometry,
                              f"{where} video ({ref.describe()})")
        except MediaGeometryError as e:
            raise DataRecordError(str(e)) from None

    def load(self, refs: list[MediaRef], where: str) -> dict[str, torch.Tensor]:
        if not refs:
            return {"video": torch.empty(0, _patch_width(self.cfg)),
                    "video_grid_thw": torch.empty(0, 3, dtype=torch.long),
                    "second_per_grid_ts": torch.empty(0)}
        videos = [([load_image(f, context=f"{where} video {i} frame {j}")
                    for j, f in enumerate(r.frames)], r.fps) for i, r in enumerate(refs)]
        out = process_media(videos=videos, cfg=self.cfg, context=where)
        return {"video": out.pixel_values_videos, "video_grid_thw": out.video_grid_thw,
                "second_per_grid_ts": out.second_per_grid_ts}


def _patch_width(cfg: QwenVLProcessorConfig) -> int:
    geo = cfg.geometry
    return 3 * geo.temporal_patch_size * geo.patch_size ** 2


def qwen_vl_processor(model, enc) -> tuple:
    """The Qwen2.5-VL family's (``families/qwen2_5_vl/encoder.py``; ``model``: the run's
    model group): one processor per modality, the geometry from the config, pixel
    statistics from ``--image-processor-config`` (a Qwen2-VL ``preprocessor_config.json``)
    when given, else Qwen's (CLIP's)."""
    from .encoder import geometry

    stats = {}
    path = model.image_processor_config
    if path:
        stats = qwen_vl_statistics(path)
    cfg = QwenVLProcessorConfig(geometry=geometry(enc), **stats)
    return (QwenVLImageProcessor(cfg, enc.tokens_per_second), QwenVLVideoProcessor(cfg))


def qwen_vl_statistics(path: str) -> dict:
    """mean, std and rescale factor of a Qwen2-VL ``preprocessor_config.json``."""
    import json

    from ...config import ConfigError

    cfg = json.load(open(path))
    kind = cfg.get("image_processor_type", "")
    if not kind.startswith("Qwen2VLImageProcessor"):
        raise ConfigError(f"--image-processor-config {path}: image_processor_type {kind!r}; "
                          "the qwen2_5_vl encoder reads Qwen2VLImageProcessor's")
    return dict(mean=tuple(cfg["image_mean"]), std=tuple(cfg["image_std"]),
                rescale_factor=cfg.get("rescale_factor", 1 / 255))
