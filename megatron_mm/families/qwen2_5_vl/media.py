"""Qwen2-VL / Qwen2.5-VL media processing at native resolution: images and videos ->
``pixel_values`` rows in the vision encoder's patch order, grids (t, h, w), exact
placeholder counts and ``second_per_grid_ts``.

Mirrors transformers' ``Qwen2VLImageProcessorPil`` step for step (convert to RGB with
transparency on white, bicubic resize of the uint8 image to the ``smart_resize`` size,
rescale in float64 then float32, normalise in float32, patchify), so ``pixel_values``
equal it bit for bit. A video is a list of frames with an fps; each frame goes through the
same resize and normalisation (PIL, as the image path: transformers' video processor
resizes with torchvision, which this package does not require), then frames are grouped by
``temporal_patch_size`` exactly as transformers' ``Qwen2VLVideoProcessor.patchify`` does.

Row layout of ``pixel_values`` (what the Conv3d patch embedding reads): rows go over
(t, h / merge, w / merge, merge_h, merge_w), so each 2x2 merge window is 4 consecutive
rows; each row is (channel, temporal, patch_y, patch_x) flattened.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from ...data.media import check_pixel_statistics, rescale_and_normalise, to_rgb
from ...data.records import DataRecordError
from ..errors import MediaGeometryError
from .geometry import (QwenVLGeometry, image_resized_size,
                       num_placeholder_tokens, second_per_grid_t,
                       video_frame_count, video_resized_size)

# OpenAI CLIP statistics: Qwen2-VL's and Qwen2.5-VL's preprocessor_config.json use them.
QWEN_VL_MEAN = (0.48145466, 0.4578275, 0.40821073)
QWEN_VL_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class QwenVLProcessorConfig:
    """Geometry plus the pixel statistics of the processor config (``image_mean``,
    ``image_std``, ``rescale_factor``)."""

    geometry: QwenVLGeometry = field(default_factory=QwenVLGeometry)
    mean: tuple[float, float, float] = QWEN_VL_MEAN
    std: tuple[float, float, float] = QWEN_VL_STD
    rescale_factor: float = 1 / 255

    def __post_init__(self):
        check_pixel_statistics(self.mean, self.std)


@dataclass
class QwenVLMedia:
    """Model inputs of one sample's (or one batch's) media, in the Hugging Face names.

    ``image_tokens`` / ``video_tokens``: placeholder count of each item, in order.
    """

    pixel_values: torch.Tensor | None = None  # [sum t*h*w of images, C*T*P*P] float32
    image_grid_thw: torch.Tensor | None = None  # [n_images, 3] int64
    pixel_values_videos: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    second_per_grid_ts: torch.Tensor | None = None  # [n_videos] float32
    image_tokens: list[int] = field(default_factory=list)
    video_tokens: list[int] = field(default_factory=list)


def normalised(image: Image.Image, size_hw: tuple[int, int],
                cfg: QwenVLProcessorConfig) -> np.ndarray:
    """[3, H, W] float32: bicubic resize on uint8, rescale (float64 -> float32), normalise."""
    height, width = size_hw
    if image.size != (width, height):
        image = image.resize((width, height), Image.Resampling.BICUBIC)
    x = np.asarray(image).transpose(2, 0, 1)
    return rescale_and_normalise(x, cfg.mean, cfg.std, cfg.rescale_factor)


def patchify(frames: np.ndarray, geo: QwenVLGeometry) -> tuple[np.ndarray, tuple[int, int, int]]:
    """[F, C, H, W] (F a multiple of temporal_patch_size) -> rows [t*h*w, C*T*P*P] in the
    encoder's order, and the grid (t, h, w)."""
    num_frames, channel, height, width = frames.shape
    tp, p, m = geo.temporal_patch_size, geo.patch_size, geo.merge_size
    grid_t, grid_h, grid_w = num_frames // tp, height // p, width // p
    x = frames.reshape(grid_t, tp, channel, grid_h // m, m, p, grid_w // m, m, p)
    # -> (t, h/m, w/m, mh, mw, C, tp, py, px): merge windows contiguous, Conv3d's row order
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return (np.ascontiguousarray(x).reshape(grid_t * grid_h * grid_w, channel * tp * p * p),
            (grid_t, grid_h, grid_w))


def _geometry_error(e: MediaGeometryError) -> DataRecordError:
    return DataRecordError(str(e))


def process_image(image, cfg: QwenVLProcessorConfig,
                  context: str = "image") -> tuple[np.ndarray, tuple[int, int, int]]:
    """One image -> (rows [h*w, C*T*P*P] float32, grid (1, h, w)); the frame is repeated
    to fill the temporal patch. Errors name ``context`` (e.g. "file x.jsonl line 3
    (record 'r7') image 1")."""
    geo = cfg.geometry
    rgb = to_rgb(image, context)
    try:
        size = image_resized_size(rgb.height, rgb.width, geo, context)
    except MediaGeometryError as e:
        raise _geometry_error(e) from None
    x = normalised(rgb, size, cfg)
    frames = np.broadcast_to(x[None], (geo.temporal_patch_size, *x.shape))
    return patchify(frames, geo)


def process_video(frames, fps: float, cfg: QwenVLProcessorConfig,
                  context: str = "video") -> tuple[np.ndarray, tuple[int, int, int], float]:
    """A clip (frames as PIL images or uint8 arrays, all one size) at ``fps`` frames per
    second -> (rows [t*h*w, C*T*P*P] float32, grid (t, h, w), second_per_grid_t)."""
    geo = cfg.geometry
    frames = list(frames)
    try:
        seconds = second_per_grid_t(fps, geo, context)
        padded = video_frame_count(len(frames), geo, context)
        rgb = [to_rgb(f, f"{context} frame {i}") for i, f in enumerate(frames)]
        sizes = {f.size for f in rgb}
        if len(sizes) > 1:
            raise DataRecordError(f"{context}: all frames must have one size, got "
                                  f"{sorted(f'{w}x{h}' for w, h in sizes)} (width x height)")
        size = video_resized_size(len(rgb), rgb[0].height, rgb[0].width, geo, context)
    except MediaGeometryError as e:
        raise _geometry_error(e) from None
    x = np.stack([normalised(f, size, cfg) for f in rgb])
    if padded > len(rgb):  # odd_frames="repeat_last": transformers repeats the last frame
        x = np.concatenate([x, np.repeat(x[-1:], padded - len(rgb), axis=0)])
    rows, grid = patchify(x, geo)
    return rows, grid, seconds


def process_media(images=(), videos=(), cfg: QwenVLProcessorConfig | None = None,
                  context: str = "record") -> QwenVLMedia:
    """All images and videos of one sample (``videos``: (frames, fps) pairs), in order.

    Items are numbered in errors: "<context> image 1: ...", "<context> video 0: ...".
    """
    cfg = cfg or QwenVLProcessorConfig()
    merge = cfg.geometry.merge_size
    out = QwenVLMedia()
    if images:
        rows, grids = [], []
        for i, image in enumerate(images):
            r, g = process_image(image, cfg, f"{context} image {i}")
            rows.append(r)
            grids.append(g)
        out.pixel_values = torch.from_numpy(np.concatenate(rows))
        out.image_grid_thw = torch.tensor(grids, dtype=torch.int64)
        out.image_tokens = [num_placeholder_tokens(g, merge) for g in grids]
    if videos:
        rows, grids, seconds = [], [], []
        for i, item in enumerate(videos):
            try:
                frames, fps = item
            except (TypeError, ValueError):
                raise DataRecordError(f"{context} video {i}: expected (frames, fps)") from None
            r, g, s = process_video(frames, fps, cfg, f"{context} video {i}")
            rows.append(r)
            grids.append(g)
            seconds.append(s)
        out.pixel_values_videos = torch.from_numpy(np.concatenate(rows))
        out.video_grid_thw = torch.tensor(grids, dtype=torch.int64)
        out.second_per_grid_ts = torch.tensor(seconds, dtype=torch.float32)
        out.video_tokens = [num_placeholder_tokens(g, merge) for g in grids]
    return out
