"""megatron_mm's image preprocessing from a Hugging Face ``preprocessor_config.json``.

CLIPImageProcessor: resize the shortest edge, center crop, rescale, normalise.
SiglipImageProcessor: resize to height x width, rescale, normalise. Both bicubic.
"""

from __future__ import annotations

import json

from ..data.media import ImageProcessorConfig
from .errors import ConversionError

BICUBIC = 3  # PIL's code, as Hugging Face configs store it
SUPPORTED = ("CLIPImageProcessor", "SiglipImageProcessor")


def image_processor_from_hf(path: str) -> ImageProcessorConfig:
    cfg = json.load(open(path))
    kind = cfg.get("image_processor_type", "").removesuffix("Fast").removesuffix("Pil")
    if kind not in SUPPORTED:
        raise ConversionError(f"{path}: image_processor_type {kind!r} is not supported; "
                              f"supported: {', '.join(SUPPORTED)}")
    for key, want in (("resample", BICUBIC), ("do_resize", True), ("do_rescale", True),
                      ("do_normalize", True), ("do_convert_rgb", True)):
        if cfg.get(key, want) != want:
            raise ConversionError(f"{path}: {key}={cfg[key]!r} is not supported "
                                  f"(only {want!r})")
    size = cfg["size"]
    if "shortest_edge" in size:  # CLIP: resize keeping the aspect ratio, then crop
        crop = cfg.get("crop_size") or {}
        if not cfg.get("do_center_crop", False) or crop.get("height") != crop.get("width"):
            raise ConversionError(f"{path}: a shortest_edge resize needs a square center "
                                  f"crop (crop_size height == width)")
        image_size, shortest_edge = crop["height"], size["shortest_edge"]
    else:
        if size.get("height") != size.get("width") or cfg.get("do_center_crop", False):
            raise ConversionError(f"{path}: only square resizes without a crop are "
                                  f"supported, got size={size}")
        image_size, shortest_edge = size["height"], None
    return ImageProcessorConfig(image_size=image_size, shortest_edge=shortest_edge,
                                mean=tuple(cfg["image_mean"]), std=tuple(cfg["image_std"]),
                                rescale_factor=cfg.get("rescale_factor", 1 / 255))
