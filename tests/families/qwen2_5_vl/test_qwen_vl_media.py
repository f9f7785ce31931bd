"""Qwen2-VL media processing equals transformers bit for bit: images against
``Qwen2VLImageProcessorPil`` (the processor transformers builds without torchvision), video
patch order against ``Qwen2VLVideoProcessor.patchify`` run from transformers' own source
(its module imports torchvision, which is not installed: the method itself is torch-only)."""

import ast
import inspect

import numpy as np
import pytest
import torch

from megatron_mm.families.qwen2_5_vl.media import (QwenVLProcessorConfig, patchify, process_image,
                                                   process_media, process_video)
from megatron_mm.data.records import DataRecordError
from megatron_mm.families.qwen2_5_vl.geometry import QwenVLGeometry
from media_files import random_image as _image

SMALL = dict(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
# sizes: already a grid multiple, upscaled, downscaled, wide, tall, round-half-even corner
SIZES = [(56, 56), (30, 200), (123, 77), (300, 500), (28, 28), (57, 85), (42, 350)]


def _hf_image_processor(**kwargs):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import \
        Qwen2VLImageProcessorPil
    return Qwen2VLImageProcessorPil(**kwargs)


def test_images_equal_transformers_bit_for_bit():
    hf = _hf_image_processor(**SMALL)
    cfg = QwenVLProcessorConfig(QwenVLGeometry(**SMALL))
    images = [_image(h, w, i) for i, (h, w) in enumerate(SIZES)]
    want = hf(images=images, return_tensors="np")
    got = process_media(images, cfg=cfg)
    assert got.image_grid_thw.tolist() == want["image_grid_thw"].tolist()
    assert got.pixel_values.dtype == torch.float32
    assert got.pixel_values.shape == want["pixel_values"].shape
    assert np.array_equal(got.pixel_values.numpy(), want["pixel_values"])
    assert got.image_tokens == [t * h * w // 4 for t, h, w in want["image_grid_thw"].tolist()]
    assert sum(got.image_tokens) * 4 == got.pixel_values.shape[0]


def test_modes_statistics_and_tiny_images_equal_transformers():
    # RGBA (composited on white), grayscale, other mean/std and rescale, default sizes,
    # and a tiny image accepted as transformers 5.x does (min_image_side=1: upscaled)
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.5, 0.75)
    hf = _hf_image_processor(image_mean=mean, image_std=std, rescale_factor=1 / 127.5)
    cfg = QwenVLProcessorConfig(QwenVLGeometry(min_image_side=1), mean=mean, std=std,
                                rescale_factor=1 / 127.5)
    images = [_image(60, 90, 1, "RGBA"), _image(45, 33, 2, "L"), _image(9, 14, 3),
              _image(700, 900, 4)]
    want = hf(images=images, return_tensors="np")
    got = process_media(images, cfg=cfg)
    assert got.image_grid_thw.tolist() == want["image_grid_thw"].tolist()
    assert np.array_equal(got.pixel_values.numpy(), want["pixel_values"])
    # a uint8 HWC array is the same image as its PIL form
    rows, grid = process_image(np.asarray(images[3]), cfg)
    assert np.array_equal(rows, want["pixel_values"][-grid[1] * grid[2]:])


def _hf_video_patchify():
    """transformers' Qwen2VLVideoProcessor.patchify, compiled from the installed source."""
    import transformers.models.qwen2_vl as pkg
    path = inspect.getfile(pkg).replace("__init__.py", "video_processing_qwen2_vl.py")
    tree = ast.parse(open(path).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef)
               and n.name == "Qwen2VLVideoProcessor")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "patchify")
    namespace = {"torch": torch}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), namespace)
    return namespace["patchify"]


def _frames(n, h, w, seed):
    return [_image(h, w, seed + i) for i in range(n)]


@pytest.mark.parametrize("num_frames,size", [(4, (56, 84)), (2, (100, 61)), (5, (84, 56))])
def test_video_equals_transformers_patch_order(num_frames, size):
    hf_patchify = _hf_video_patchify()
    geo = QwenVLGeometry(video_min_pixels=56 * 56, video_max_pixels=28 * 28 * 16,
                         odd_frames="repeat_last")
    cfg = QwenVLProcessorConfig(geo)
    frames = _frames(num_frames, *size, seed=10)
    rows, grid, seconds = process_video(frames, 4.0, cfg)
    # each frame normalised as the image processor does it (bit for bit) ...
    hf_image = _hf_image_processor(min_pixels=geo.video_min_pixels,
                                   max_pixels=geo.video_max_pixels)
    per_frame = np.stack([hf_image(images=[f], return_tensors="np", do_resize=True)
                          ["pixel_values"] for f in frames])  # [F, h*w, C*T*P*P]
    p = geo.patch_size
    gh, gw = grid[1], grid[2]
    # undo the image patchify of one frame (its temporal copy 0) back to [3, H, W]
    x = per_frame.reshape(num_frames, gh // 2, gw // 2, 2, 2, 3, 2, p, p)[..., 0, :, :]
    x = x.transpose(0, 5, 1, 3, 6, 2, 4, 7).reshape(num_frames, 3, gh * p, gw * p)
    # ... then grouped in time by transformers' own patchify (which pads odd counts)
    want, t, h, w = hf_patchify(None, torch.from_numpy(np.ascontiguousarray(x))[None],
                                patch_size=p, merge_size=2, temporal_patch_size=2)
    assert grid == (t, h, w) == ((num_frames + 1) // 2, gh, gw)
    assert np.array_equal(rows, want[0].numpy())
    assert seconds == 0.5


def test_a_still_clip_equals_the_image():
    # two copies of one frame are the image (whose frame is repeated in time)
    geo = QwenVLGeometry(**SMALL, video_min_pixels=SMALL["min_pixels"],
                         video_max_pixels=SMALL["max_pixels"])
    cfg = QwenVLProcessorConfig(geo)
    frame = _image(123, 77, 5)
    rows, grid, _ = process_video([frame, frame], 2.0, cfg)
    want = _hf_image_processor(**SMALL)(images=[frame], return_tensors="np")
    assert list(grid) == want["image_grid_thw"][0].tolist()
    assert np.array_equal(rows, want["pixel_values"])


def test_patchify_rows_are_merge_windows_of_conv3d_patches():
    # row r of a [1, 4, 4] grid: window (r // 4), position (r % 4) inside the 2x2 window;
    # within a row: channel, time, y, x
    geo = QwenVLGeometry(patch_size=2)
    x = np.arange(2 * 3 * 8 * 8, dtype=np.float32).reshape(2, 3, 8, 8)
    rows, grid = patchify(x, geo)
    assert grid == (1, 4, 4) and rows.shape == (16, 3 * 2 * 2 * 2)
    for r in range(16):
        window, inner = divmod(r, 4)
        py = (window // 2) * 2 + inner // 2
        px = (window % 2) * 2 + inner % 2
        want = x[:, :, py * 2:py * 2 + 2, px * 2:px * 2 + 2].transpose(1, 0, 2, 3)
        assert np.array_equal(rows[r], want.reshape(-1)), r


def test_process_media_mixes_images_and_a_video():
    geo = QwenVLGeometry(**SMALL, video_min_pixels=56 * 56, video_max_pixels=28 * 28 * 16)
    out = process_media([_image(56, 56, 0), _image(90, 140, 1)],
                        [(_frames(4, 84, 84, 2), 2.0)], QwenVLProcessorConfig(geo))
    assert out.image_grid_thw.tolist() == [[1, 4, 4], [1, 6, 10]]
    assert out.video_grid_thw.tolist() == [[2, 6, 6]]
    assert out.second_per_grid_ts.tolist() == [1.0]
    assert out.image_tokens == [4, 15] and out.video_tokens == [18]
    assert out.pixel_values.shape == (16 + 60, 1176)
    assert out.pixel_values_videos.shape == (72, 1176)


def test_bad_media_errors_name_the_record_and_item():
    cfg = QwenVLProcessorConfig()
    ctx = "file d.jsonl line 3 (record 'r7')"
    with pytest.raises(DataRecordError, match=r"record 'r7'\) image 1 of size 20x50 .* below "
                                              r"the minimum size"):
        process_media([_image(56, 56, 0), _image(20, 50, 1)], cfg=cfg, context=ctx)
    with pytest.raises(DataRecordError, match=r"record 'r7'\) image 0: absolute aspect ratio"):
        process_media([_image(28, 6000, 0)], cfg=cfg, context=ctx)
    with pytest.raises(DataRecordError, match=r"record 'r7'\) video 0: 3 frames do not fit "
                                              r"the temporal patch of 2 frames"):
        process_media(videos=[(_frames(3, 56, 56, 0), 2.0)], cfg=cfg, context=ctx)
    with pytest.raises(DataRecordError, match=r"video 0: all frames must have one size"):
        process_media(videos=[([_image(56, 56, 0), _image(56, 84, 1)], 2.0)], cfg=cfg,
                      context=ctx)
    with pytest.raises(DataRecordError, match=r"video 0: fps must be a positive number"):
        process_media(videos=[(_frames(2, 56, 56, 0), 0)], cfg=cfg, context=ctx)
    with pytest.raises(DataRecordError, match=r"video 0 frame 1: an array image must be uint8"):
        process_media(videos=[([np.zeros((56, 56, 3), np.uint8),
                                np.zeros((56, 56, 3), np.float32)], 2.0)], cfg=cfg, context=ctx)
