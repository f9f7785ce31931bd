"""Qwen3-VL's video rule, pure Python: which frames of a clip are sampled, the size they are
resized to, the grid, and the timestamp text before each temporal patch.

- Sampling is transformers' ``Qwen3VLVideoProcessor.sample_frames``: a clip of ``total``
  frames at ``fps`` keeps ``int(total / fps * sample_fps)`` of them, at least
  ``min_frames``, at most ``max_frames`` and ``total``, evenly spaced
  (``linspace(0, total - 1, n).round()``); ``num_frames``, when set, is the count itself.
- The resize is its ``smart_resize``: the pixel bounds hold the whole clip (frames rounded
  to the temporal patch, times height, times width), a frame with a side below one merge
  unit is scaled up first, and fewer frames than one temporal patch are an error. An odd
  count repeats the last frame (its ``patchify``).
- Each temporal patch's text is ``<t seconds>``, ``t`` the mean time of its first and last
  frame (``Qwen3VLProcessor._calculate_timestamps``, one decimal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import MediaGeometryError
from ..qwen2_5_vl.geometry import QwenVLGeometry, check_aspect_ratio


@dataclass(frozen=True)
class VideoSampling:
    """transformers' ``Qwen3VLVideoProcessor`` sampling fields (same names, defaults)."""

    fps: float = 2.0
    num_frames: int | None = None
    min_frames: int = 4
    max_frames: int = 768

    def __post_init__(self):
        if not self.fps > 0:
            raise ValueError(f"fps must be positive, got {self.fps!r}")
        for name in ("min_frames", "max_frames") + (("num_frames",) if self.num_frames else ()):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True)
class VideoPlan:
    """What one clip becomes: the source frames taken, their size, grid and text."""

    indices: tuple[int, ...]  # source frames sampled, in order
    size: tuple[int, int]  # (height, width) each is resized to
    grid: tuple[int, int, int]  # video_grid_thw
    timestamps: tuple[str, ...]  # "<t seconds>" per temporal patch


def sample_indices(total: int, fps: float, s: VideoSampling) -> list[int]:
    if s.num_frames is not None:
        n = s.num_frames
    else:
        n = min(max(int(total / fps * s.fps), s.min_frames), s.max_frames, total)
    if n == 1:  # numpy's linspace(0, x, 1) is [0.]
        return [0]
    step = (total - 1) / (n - 1)
    # numpy's linspace(0, total - 1, n) then round-half-even, in Python
    return [round(i * step) if i < n - 1 else total - 1 for i in range(n)]


def smart_resize(num_frames: int, height: int, width: int, temporal_factor: int, factor: int,
                 min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' Qwen3-VL video ``smart_resize``, the same arithmetic."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    check_aspect_ratio(height, width)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def timestamps(indices, fps: float, temporal_patch_size: int) -> tuple[str, ...]:
    """The text before each temporal patch: its first and last frame's mean time."""
    idx = list(indices) + [indices[-1]] * (-len(indices) % temporal_patch_size)
    times = [i / fps for i in idx]
    tp = temporal_patch_size
    return tuple(f"<{(times[i] + times[i + tp - 1]) / 2:.1f} seconds>"
                 for i in range(0, len(times), tp))


def plan_video(total: int, height: int, width: int, fps: float, geo: QwenVLGeometry,
               sampling: VideoSampling, context: str = "video") -> VideoPlan:
    """The clip of ``total`` frames of ``height`` x ``width`` at ``fps``; errors name
    ``context``."""
    if not isinstance(fps, (int, float)) or isinstance(fps, bool) or not fps > 0 \
            or not math.isfinite(fps):
        raise MediaGeometryError(f"{context}: fps must be a positive number, got {fps!r}")
    if total < 1:
        raise MediaGeometryError(f"{context}: a video needs at least one frame, got 0")
    indices = sample_indices(total, fps, sampling)
    tp = geo.temporal_patch_size
    if len(indices) < tp:
        raise MediaGeometryError(
            f"{context}: {len(indices)} frame(s) (of {total} at {fps} fps, sampled at "
            f"{sampling.fps} fps) do not fill the temporal patch of {tp} frames; give the "
            f"clip at least {tp} frames")
    max_pixels = geo.video_max_pixels
    if geo.cap_pixels_per_frame:  # Qwen3-VL's cap: max_video_tokens patches a frame
        per_frame = max(min(geo.max_video_tokens * geo.factor ** 2,
                            geo.video_max_pixels // len(indices)),
                        int(geo.video_min_pixels * 1.05))
        max_pixels = per_frame * len(indices)
    try:
        size = smart_resize(len(indices), height, width, tp, geo.factor,
                            geo.video_min_pixels, max_pixels)
    except MediaGeometryError as e:
        raise MediaGeometryError(f"{context}: {e}") from None
    grid = (-(-len(indices) // tp), size[0] // geo.patch_size, size[1] // geo.patch_size)
    return VideoPlan(tuple(indices), size, grid, timestamps(indices, fps, tp))
