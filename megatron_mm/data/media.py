"""Image loading (file path or inline base64) and CLIP-style preprocessing."""
from __future__ import annotations

import base64
import binascii
import io
import os
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from .records import DataRecordError, MediaRef

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class ImageProcessorConfig:
    """The steps of Hugging Face's CLIP / SigLIP image processors, in their order.

    Default: bicubic resize straight to an ``image_size`` square (SigLIP's way). CLIP's
    way: resize the shortest edge to ``shortest_edge`` (aspect ratio kept), then center
    crop an ``image_size`` square.
    """

    image_size: int = 224  # square output side; the vision tower's input size
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD
    shortest_edge: int | None = None
    rescale_factor: float = 1 / 255


def check_pixel_statistics(mean, std) -> None:
    """A processor config's ``image_mean`` / ``image_std``: one value per RGB channel."""
    if len(mean) != 3 or len(std) != 3:
        raise ValueError("mean and std need one value per RGB channel")
    if any(s == 0 for s in std):
        raise ValueError(f"std must not contain 0, got {std}")


def rescale_and_normalise(x: np.ndarray, mean, std, rescale_factor: float) -> np.ndarray:
    """uint8 [..., 3, H, W] -> float32 as Hugging Face's image processors compute it:
    rescale in float64 then float32, normalise in float32."""
    x = (x.astype(np.float64) * rescale_factor).astype(np.float32)
    return ((x - np.asarray(mean, dtype=np.float32)[:, None, None])
            / np.asarray(std, dtype=np.float32)[:, None, None])


def _decode_data(data: str) -> bytes:
    """Bytes of a data URI ("data:image/png;base64,...") or of bare base64."""
    if data.startswith("data:"):
        header, sep, payload = data.partition(",")
        if not sep or not header.endswith(";base64"):
            raise ValueError("only base64 data URIs are supported (data:<mime>;base64,<payload>)")
        data = payload
    return base64.b64decode(data, validate=True)


def load_image(ref: MediaRef | str | dict, base_dir: str | None = None,
               context: str = "") -> Image.Image:
    """Decode one image to PIL RGB.

    `ref` is a MediaRef, a path (relative to `base_dir`), a data URI string or a
    {"data": ...} object; failures raise DataRecordError prefixed with `context`.
    """
    if isinstance(ref, dict):
        ref = MediaRef(data=ref.get("data"))
    elif isinstance(ref, str):
        if ref.startswith("data:"):
            ref = MediaRef(data=ref)
        else:
            absolute = base_dir is None or os.path.isabs(ref)
            ref = MediaRef(path=ref if absolute else os.path.join(base_dir, ref))
    prefix = f"{context}: " if context else ""
    try:
        if ref.path is not None:
            if not os.path.exists(ref.path):
                raise DataRecordError(f"{prefix}image file not found: {ref.path}")
            with Image.open(ref.path) as im:
                return im.convert("RGB")  # convert() forces the full decode while the file is open
        raw = ref.raw if ref.raw is not None else _decode_data(ref.data or "")
        with Image.open(io.BytesIO(raw)) as im:
            return im.convert("RGB")
    except DataRecordError:
        raise
    except (OSError, ValueError, binascii.Error, Image.DecompressionBombError) as e:
        raise DataRecordError(f"{prefix}cannot decode image {ref.describe()}: {e}") from e


def _resized_size(width: int, height: int, cfg: ImageProcessorConfig) -> tuple[int, int]:
    """(width, height) after the resize; Hugging Face's rounding (int() of the long side)."""
    edge = cfg.shortest_edge
    if edge is None:
        return cfg.image_size, cfg.image_size
    short, long = sorted((width, height))
    new_long = int(edge * long / short)
    return (edge, new_long) if width <= height else (new_long, edge)


def preprocess_image(img: Image.Image, cfg: ImageProcessorConfig) -> torch.Tensor:
    """PIL image -> float32 [3, S, S]: bicubic resize (on uint8, as Hugging Face's PIL
    backend), center crop, rescale in float64 then float32, normalise in float32."""
    img = img.convert("RGB")
    size = _resized_size(*img.size, cfg)
    if img.size != size:
        img = img.resize(size, Image.Resampling.BICUBIC)
    x = np.asarray(img)  # [H, W, 3] uint8
    top, left = (x.shape[0] - cfg.image_size) // 2, (x.shape[1] - cfg.image_size) // 2
    x = x[top:top + cfg.image_size, left:left + cfg.image_size].transpose(2, 0, 1)
    x = rescale_and_normalise(x, cfg.mean, cfg.std, cfg.rescale_factor)
    return torch.from_numpy(np.ascontiguousarray(x))


def to_rgb(image, context: str) -> Image.Image:
    """PIL RGB, transparency composited on white (transformers' convert_to_rgb)."""
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3) or \
                (image.ndim == 3 and image.shape[-1] not in (1, 3, 4)):
            raise DataRecordError(f"{context}: an array image must be uint8 [H, W] or "
                                  f"[H, W, 1|3|4], got {image.dtype} {list(image.shape)}")
        image = Image.fromarray(image[..., 0] if image.ndim == 3 and image.shape[-1] == 1
                                else image)
    if not isinstance(image, Image.Image):
        raise DataRecordError(f"{context}: expected a PIL image or a uint8 array, got "
                              f"{type(image).__name__}")
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def image_size(ref: MediaRef, context: str) -> tuple[int, int]:
    """(height, width) of an image from its header, without decoding its pixels."""
    if ref.path is None and ref.raw is None and ref.data is None:
        raise DataRecordError(f"{context}: image reference without path or data")
    try:
        if ref.path is not None:
            with Image.open(ref.path) as im:
                return im.height, im.width
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise DataRecordError(f"{context}: cannot read image {ref.describe()}: {e}") from e
    return load_image(ref, context=context).size[::-1]
