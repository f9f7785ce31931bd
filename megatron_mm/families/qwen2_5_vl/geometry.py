"""Qwen2-VL / Qwen2.5-VL native-resolution geometry, pure Python: the resize rule, the
patch grid (t, h, w) of an image or a clip and its exact placeholder token count.

The planner reads per-sample vision work (patches) from these numbers without decoding a
pixel; the media processor (``megatron_mm.families.qwen2_5_vl.media``) uses the same functions,
so the planned and the real counts cannot drift apart.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import MediaGeometryError

# transformers' limit: an image or frame whose long side is more than 200 times its short
# side is refused (smart_resize's ValueError).
MAX_ASPECT_RATIO = 200
VIDEO_FRAME_POLICIES = ("error", "repeat_last")


@dataclass(frozen=True)
class QwenVLGeometry:
    """The geometry fields of Qwen2-VL's image and video processors (same names).

    ``min_pixels`` / ``max_pixels`` bound images; ``video_min_pixels`` /
    ``video_max_pixels`` bound each video frame (transformers' video processor has its own,
    larger minimum). ``min_image_side``: images or frames with a side below it are an
    error; ``None`` means ``patch_size * merge_size`` (the rule transformers applied up to
    4.48 and that the issue asks for: such an image is mostly upscaling); 1 accepts any
    image as transformers 5.x does (upscaled to ``min_pixels``). ``odd_frames``: what a
    clip whose frame count is not a multiple of ``temporal_patch_size`` does: "error", or
    "repeat_last" (transformers' video processor pads with copies of the last frame).
    ``cap_pixels_per_frame`` / ``max_video_tokens``: transformers' optional total-video
    pixel budget (off by default there too).
    """

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    video_min_pixels: int = 128 * 28 * 28
    video_max_pixels: int = 28 * 28 * 768
    min_image_side: int | None = None
    odd_frames: str = "error"
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 128000

    def __post_init__(self):
        for name in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels",
                     "max_pixels", "video_min_pixels", "video_max_pixels", "max_video_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels ({self.min_pixels}) > max_pixels ({self.max_pixels})")
        if self.video_min_pixels > self.video_max_pixels:
            raise ValueError(f"video_min_pixels ({self.video_min_pixels}) > video_max_pixels "
                             f"({self.video_max_pixels})")
        if self.min_image_side is not None and self.min_image_side < 1:
            raise ValueError(f"min_image_side must be >= 1 or None, got {self.min_image_side}")
        if self.odd_frames not in VIDEO_FRAME_POLICIES:
            raise ValueError(f"odd_frames must be one of {', '.join(VIDEO_FRAME_POLICIES)}, "
                             f"got {self.odd_frames!r}")

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this: one merge window of patches."""
        return self.patch_size * self.merge_size

    @property
    def smallest_side(self) -> int:
        return self.factor if self.min_image_side is None else self.min_image_side


def check_aspect_ratio(height: int, width: int) -> None:
    """transformers' limit on a resized image's (or clip's) sides."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaGeometryError(
            f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, got "
            f"{max(height, width) / min(height, width)} ({height}x{width})")


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 28 * 28 * 1280) -> tuple[int, int]:
    """(height, width) after Qwen2-VL's resize: both multiples of ``factor``, area within
    [min_pixels, max_pixels], aspect ratio kept as closely as the rounding allows.

    The same arithmetic as transformers' ``smart_resize`` (Python's round-half-even
    included), so grids and token counts agree with it exactly.
    """
    if height < 1 or width < 1:
        raise MediaGeometryError(f"image of size {height}x{width} has no pixels")
    check_aspect_ratio(height, width)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _check_side(height: int, width: int, geo: QwenVLGeometry, what: str) -> None:
    side = geo.smallest_side
    if min(height, width) < side:
        raise MediaGeometryError(
            f"{what} of size {height}x{width} (height x width) is below the minimum size: "
            f"each side must be at least {side} pixels")


def image_resized_size(height: int, width: int, geo: QwenVLGeometry,
                       context: str = "image") -> tuple[int, int]:
    """(height, width) an image is resized to; a clear error naming ``context`` for an
    image below the minimum size or with an aspect ratio above 200."""
    _check_side(height, width, geo, context)
    try:
        return smart_resize(height, width, geo.factor, geo.min_pixels, geo.max_pixels)
    except MediaGeometryError as e:
        raise MediaGeometryError(f"{context}: {e}") from None


def video_frame_count(num_frames: int, geo: QwenVLGeometry, context: str = "video") -> int:
    """Frames after temporal grouping: the count itself, or padded up to a multiple of
    ``temporal_patch_size`` with ``odd_frames="repeat_last"``; otherwise a clear error."""
    tp = geo.temporal_patch_size
    if num_frames < 1:
        raise MediaGeometryError(f"{context}: a video needs at least one frame, got 0")
    if num_frames % tp:
        if geo.odd_frames == "error":
            raise MediaGeometryError(
                f"{context}: {num_frames} frames do not fit the temporal patch of {tp} frames "
                f"(the frame count must be a multiple of {tp}; drop or add frames, or let the "
                f"last frame repeat with odd_frames='repeat_last')")
        num_frames += -num_frames % tp
    return num_frames


def video_resized_size(num_frames: int, height: int, width: int, geo: QwenVLGeometry,
                       context: str = "video") -> tuple[int, int]:
    """(height, width) every frame of a clip is resized to (transformers' video rule:
    the video pixel bounds, optionally capped by an even share of ``max_video_tokens``)."""
    _check_side(height, width, geo, f"{context} frame")
    max_pixels = geo.video_max_pixels
    if geo.cap_pixels_per_frame:
        total_pixels = int(geo.max_video_tokens * geo.factor * geo.factor * 0.9)
        max_pixels = max(min(max_pixels, total_pixels * geo.temporal_patch_size // num_frames),
                         int(geo.video_min_pixels * 1.05))
    try:
        return smart_resize(height, width, geo.factor, geo.video_min_pixels, max_pixels)
    except MediaGeometryError as e:
        raise MediaGeometryError(f"{context}: {e}") from None


def image_grid(height: int, width: int, geo: QwenVLGeometry,
               context: str = "image") -> tuple[int, int, int]:
    """``image_grid_thw`` of one image: (1, resized_h / patch, resized_w / patch)."""
    h, w = image_resized_size(height, width, geo, context)
    return 1, h // geo.patch_size, w // geo.patch_size


def video_grid(num_frames: int, height: int, width: int, geo: QwenVLGeometry,
               context: str = "video") -> tuple[int, int, int]:
    """``video_grid_thw`` of one clip of ``num_frames`` frames of ``height`` x ``width``."""
    frames = video_frame_count(num_frames, geo, context)
    h, w = video_resized_size(num_frames, height, width, geo, context)
    return frames // geo.temporal_patch_size, h // geo.patch_size, w // geo.patch_size


def num_patches(grid_thw) -> int:
    """Vision-encoder input rows of one item (rows of ``pixel_values``)."""
    t, h, w = grid_thw
    return t * h * w


def num_placeholder_tokens(grid_thw, merge_size: int = 2) -> int:
    """LLM placeholder tokens of one item: its patches after the merge_size^2 merger."""
    t, h, w = grid_thw
    if h % merge_size or w % merge_size:
        raise MediaGeometryError(f"grid {tuple(grid_thw)}: h and w must be multiples of the "
                                 f"merge size {merge_size}")
    return t * (h // merge_size) * (w // merge_size)


def second_per_grid_t(fps: float, geo: QwenVLGeometry, context: str = "video") -> float:
    """Seconds one temporal patch spans (the processor's ``second_per_grid_ts`` entry)."""
    if not isinstance(fps, (int, float)) or isinstance(fps, bool) or not fps > 0 \
            or not math.isfinite(fps):
        raise MediaGeometryError(f"{context}: fps must be a positive number, got {fps!r}")
    return geo.temporal_patch_size / fps
