"""Qwen2-VL's resize rule, grids and placeholder counts (pure Python) equal transformers'."""

import random
import subprocess
import sys

import pytest

from megatron_mm.families.errors import MediaGeometryError
from megatron_mm.families.qwen2_5_vl.geometry import (QwenVLGeometry, image_grid, num_patches,
                                                      num_placeholder_tokens, second_per_grid_t,
                                                      smart_resize, video_grid)


def test_smart_resize_equals_transformers_on_many_sizes():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import \
        smart_resize as hf_smart_resize

    rng = random.Random(0)
    bounds = [(56 * 56, 28 * 28 * 1280), (4 * 28 * 28, 16 * 28 * 28),
              (128 * 28 * 28, 768 * 28 * 28)]
    sizes = [(rng.randint(1, 3000), rng.randint(1, 3000)) for _ in range(3000)]
    # round-half-even corners: sides at 14 + 28k round to an even multiple of 28
    sizes += [(14 + 28 * k, 42 + 28 * k) for k in range(20)] + [(1, 150), (3000, 15)]
    for min_px, max_px in bounds:
        for h, w in sizes:
            if max(h, w) / min(h, w) > 200:
                continue
            assert smart_resize(h, w, 28, min_px, max_px) == \
                hf_smart_resize(h, w, 28, min_px, max_px), (h, w, min_px, max_px)


def test_resize_stays_within_bounds_and_multiples():
    for h, w in ((28, 28), (1000, 30), (4000, 3000), (57, 85)):
        rh, rw = smart_resize(h, w, 28, 56 * 56, 28 * 28 * 64)
        assert rh % 28 == 0 and rw % 28 == 0
        assert 56 * 56 <= rh * rw <= 28 * 28 * 64


def test_aspect_ratio_above_200_is_refused_like_transformers():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import \
        smart_resize as hf_smart_resize

    with pytest.raises(ValueError, match="aspect ratio"):
        hf_smart_resize(28, 28 * 201)
    with pytest.raises(MediaGeometryError, match=r"record 'r1' image 0: absolute aspect "
                                                 r"ratio must be smaller than 200"):
        image_grid(28, 28 * 201, QwenVLGeometry(), context="record 'r1' image 0")
    assert image_grid(28, 28 * 200, QwenVLGeometry()) == (1, 2, 400)  # exactly 200 is fine


def test_image_below_the_minimum_size_is_named():
    geo = QwenVLGeometry()
    with pytest.raises(MediaGeometryError, match=r"record 'x' image 2 of size 20x40 .* below "
                                                 r"the minimum size: each side must be at "
                                                 r"least 28 pixels"):
        image_grid(20, 40, geo, context="record 'x' image 2")
    # transformers 5.x instead upscales a small image to min_pixels: min_image_side=1
    assert image_grid(20, 40, QwenVLGeometry(min_image_side=1)) == (1, 4, 6)
    with pytest.raises(MediaGeometryError, match="no pixels"):
        smart_resize(0, 10)


def test_grid_and_token_counts():
    geo = QwenVLGeometry(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
    grid = image_grid(123, 77, geo)
    assert grid == (1, 8, 6) and num_patches(grid) == 48
    assert num_placeholder_tokens(grid, 2) == 12
    vgrid = video_grid(6, 56, 84, QwenVLGeometry(video_min_pixels=56 * 56))
    assert vgrid == (3, 4, 6) and num_placeholder_tokens(vgrid) == 18
    with pytest.raises(MediaGeometryError, match="multiples of the merge size"):
        num_placeholder_tokens((1, 3, 4))


def test_video_frames_that_do_not_fit_the_temporal_patch():
    with pytest.raises(MediaGeometryError, match=r"record 'v' video 0: 3 frames do not fit "
                                                 r"the temporal patch of 2 frames"):
        video_grid(3, 56, 56, QwenVLGeometry(), context="record 'v' video 0")
    with pytest.raises(MediaGeometryError, match="at least one frame"):
        video_grid(0, 56, 56, QwenVLGeometry())
    # transformers' way: the last frame repeats up to the next multiple
    assert video_grid(3, 56, 56, QwenVLGeometry(odd_frames="repeat_last",
                                                video_min_pixels=56 * 56))[0] == 2


def test_video_pixel_cap_is_transformers_formula():
    # cap_pixels_per_frame: max_pixels = max(min(max, 0.9 * tokens * 28^2 * 2 / frames),
    # 1.05 * min); 1000 tokens over 40 frames -> 35280 px per frame
    geo = QwenVLGeometry(video_min_pixels=56 * 56, cap_pixels_per_frame=True,
                         max_video_tokens=1000)
    assert video_grid(40, 1000, 1000, geo) == (20, 12, 12)  # 168 x 168 = 28224 <= 35280
    assert video_grid(40, 1000, 1000, QwenVLGeometry(video_min_pixels=56 * 56)) == (20, 54, 54)


def test_second_per_grid_t_and_bad_fps():
    assert second_per_grid_t(4.0, QwenVLGeometry()) == 0.5
    for fps in (0, -1.0, float("nan"), "2"):
        with pytest.raises(MediaGeometryError, match="record 'v' video 1: fps must be a "
                                                     "positive number"):
            second_per_grid_t(fps, QwenVLGeometry(), "record 'v' video 1")


def test_config_validates_itself():
    with pytest.raises(ValueError, match="min_pixels .* > max_pixels"):
        QwenVLGeometry(min_pixels=100, max_pixels=50)
    with pytest.raises(ValueError, match="odd_frames must be one of error, repeat_last"):
        QwenVLGeometry(odd_frames="pad")
    with pytest.raises(ValueError, match="patch_size must be a positive integer"):
        QwenVLGeometry(patch_size=0)


@pytest.mark.processes
def test_grid_module_imports_no_torch():
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, megatron_mm.families.qwen2_5_vl.geometry, "
         "megatron_mm.families.qwen2_5_vl.mrope_positions\nassert 'torch' not in sys.modules"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
