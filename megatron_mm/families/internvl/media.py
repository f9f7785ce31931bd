"""InternVL dynamic tiling of images: pixels of each tile, tile counts, placeholder counts,
the record's token budget check and the ``<img>``/``<IMG_CONTEXT>``/``</img>`` expansion.

Mirrors transformers' ``GotOcr2ImageProcessorPil`` with ``crop_to_patches=True`` (what
``InternVLProcessor`` asks for) step for step: convert to RGB (transparency on white),
bicubic resize of the uint8 image to the grid's canvas, cut row by row into tiles, the
thumbnail (the original resized to one tile) last, then rescale in float64 -> float32 and
normalise in float32, so ``pixel_values`` equal it bit for bit. The grid and counts come
from ``megatron_mm.families.internvl.tiles`` (pure Python).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch
from PIL import Image

from ...data.media import (check_pixel_statistics, image_size, load_image,
                           rescale_and_normalise, to_rgb)
from ...data.records import DataRecordError, MediaRef, Record
from ..errors import MediaGeometryError
from .tiles import (IMAGENET_MEAN, IMAGENET_STD, InternVLTiling,
                    check_sample_budget, context_tokens,
                    optimal_grid, tile_count)


@dataclass(frozen=True)
class InternVLProcessorConfig:
    """Tiling plus the pixel statistics of the processor config (``image_mean``,
    ``image_std``, ``rescale_factor``)."""

    tiling: InternVLTiling = field(default_factory=InternVLTiling)
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    rescale_factor: float = 1 / 255

    def __post_init__(self):
        check_pixel_statistics(self.mean, self.std)


@dataclass
class InternVLMedia:
    """Model inputs of one sample's (or batch's) images, in the Hugging Face names.

    ``num_tiles``: tiles of each image in order (transformers' ``num_patches``);
    ``image_tokens``: ``<IMG_CONTEXT>`` tokens of each image.
    """

    pixel_values: torch.Tensor  # [sum num_tiles, 3, tile, tile] float32
    num_tiles: list[int]
    image_tokens: list[int]


def _normalise(x: np.ndarray, cfg: InternVLProcessorConfig) -> np.ndarray:
    """uint8 [..., 3, H, W] -> float32: rescale in float64 then float32, normalise."""
    return rescale_and_normalise(x, cfg.mean, cfg.std, cfg.rescale_factor)


def tile_image(image, cfg: InternVLProcessorConfig, context: str = "image") -> np.ndarray:
    """One image (PIL or uint8 array) -> its tiles [n, 3, tile, tile] float32: the grid's
    cells row by row, then the thumbnail when there is one."""
    tiling = cfg.tiling
    size = tiling.tile_size
    rgb = to_rgb(image, context)
    try:
        cols, rows = optimal_grid(rgb.height, rgb.width, tiling, context)
    except MediaGeometryError as e:
        raise DataRecordError(str(e)) from None
    canvas = rgb.resize((cols * size, rows * size), Image.Resampling.BICUBIC)
    x = np.asarray(canvas).transpose(2, 0, 1)  # [3, rows*size, cols*size] uint8
    tiles = x.reshape(3, rows, size, cols, size).transpose(1, 3, 0, 2, 4).reshape(-1, 3, size, size)
    if tiling.use_thumbnail and cols * rows > 1:
        thumb = np.asarray(rgb.resize((size, size), Image.Resampling.BICUBIC)).transpose(2, 0, 1)
        tiles = np.concatenate([tiles, thumb[None]])
    return _normalise(tiles, cfg)


def process_images(images, cfg: InternVLProcessorConfig | None = None,
                   context: str = "record") -> InternVLMedia:
    """All images of one sample, in order; errors name "<context> image <i>"."""
    cfg = cfg or InternVLProcessorConfig()
    tiles = [tile_image(im, cfg, f"{context} image {i}") for i, im in enumerate(images)]
    if not tiles:
        size = cfg.tiling.tile_size
        return InternVLMedia(torch.empty(0, 3, size, size), [], [])
    counts = [len(t) for t in tiles]
    return InternVLMedia(torch.from_numpy(np.concatenate(tiles)), counts,
                         [context_tokens(n, cfg.tiling) for n in counts])


def load_record_images(record: Record, cfg: InternVLProcessorConfig | None = None
                       ) -> InternVLMedia:
    """Decode and tile a record's images; a missing or corrupt image is a DataRecordError
    naming the record and the image."""
    where = record.where()
    images = [load_image(ref, context=f"{where} image {i}")
              for i, ref in enumerate(record.media.get("image", []))]
    return process_images(images, cfg, where)


def image_token_counter(tiling: InternVLTiling):
    """``processing.MediaTokenCount`` for images: the context tokens of the item's tiles
    (read from the file header), called as f(ref, where)."""
    def count(ref: MediaRef, where: str) -> int:
        h, w = image_size(ref, where)
        return context_tokens(tile_count(h, w, tiling, where), tiling)
    return count


def check_record_budget(record: Record, text_tokens: int, seq_length: int,
                        tiling: InternVLTiling) -> int:
    """The record's sequence length (``text_tokens`` plus each image's ``<img>``, context
    tokens and ``</img>``), from image headers; a DataRecordError naming the record, each
    image's tiles and the ``--max-num-tiles`` that would fit when over ``seq_length``."""
    where = record.where()
    sizes = [image_size(ref, f"{where} image {i}")
             for i, ref in enumerate(record.media.get("image", []))]
    try:
        return check_sample_budget(sizes, text_tokens, seq_length, tiling, where)
    except MediaGeometryError as e:
        raise DataRecordError(str(e)) from None


def expand_image_placeholders(ids: list[int], num_tiles: list[int], tiling: InternVLTiling,
                              context_id: int, start_id: int, end_id: int,
                              context: str = "record") -> list[int]:
    """Token ids with each single ``<IMG_CONTEXT>`` id (one per image, in order) replaced by
    ``<img>`` + tiles * tokens_per_tile ``<IMG_CONTEXT>`` + ``</img>``, as
    ``InternVLProcessor`` expands its text."""
    found = ids.count(context_id)
    if found != len(num_tiles):
        raise DataRecordError(f"{context}: {found} image placeholders for {len(num_tiles)} "
                              f"images")
    out, k = [], 0
    for t in ids:
        if t == context_id:
            out += [start_id] + [context_id] * context_tokens(num_tiles[k], tiling) + [end_id]
            k += 1
        else:
            out.append(t)
    return out


@dataclass
class InternVLImageProcessor:
    """The InternVL family's media processor (``families/internvl/encoder.py``): each image cut
    into tiles; a batch's ``image`` holds every tile ([tiles, 3, S, S]), each tile one
    encoder item handing the LLM ``tokens_per_tile`` tokens."""

    cfg: InternVLProcessorConfig
    modality: str = "image"

    def load(self, refs: list[MediaRef], where: str) -> dict[str, torch.Tensor]:
        images = [load_image(r, context=f"{where} image {i}") for i, r in enumerate(refs)]
        return {"image": process_images(images, self.cfg, where).pixel_values}

    def vision_work(self, ref: MediaRef, where: str) -> int:
        """Tiles of the image (its encoder work), from its header."""
        h, w = image_size(ref, where)
        return tile_count(h, w, self.cfg.tiling, where)

    def token_count(self, ref: MediaRef, where: str) -> int:
        return context_tokens(self.vision_work(ref, where), self.cfg.tiling)

    def overflow_advice(self, record: Record, tokens: int, seq_length: int) -> str:
        """Why a record is over ``--seq-length``: each image's tiles, and the largest
        ``--max-num-tiles`` that would fit."""
        tiling = self.cfg.tiling
        where = record.where()
        sizes = [image_size(r, f"{where} image {i}")
                 for i, r in enumerate(record.media.get("image", []))]
        if not sizes:
            return ""
        image = sum(context_tokens(tile_count(h, w, tiling), tiling) for h, w in sizes)
        text = tokens - image
        fit = next((m for m in range(tiling.max_tiles, tiling.min_tiles - 1, -1)
                    if text + sum(context_tokens(tile_count(h, w, replace(tiling, max_tiles=m)),
                                                 tiling) for h, w in sizes) <= seq_length),
                   None)
        parts = ", ".join(f"image {i} ({w}x{h}): {tile_count(h, w, tiling)} tiles"
                          for i, (h, w) in enumerate(sizes))
        advice = (f"lower --max-num-tiles to {fit} or raise --seq-length" if fit is not None
                  else "raise --seq-length or drop the record")
        return (f"; {image} image tokens ({tiling.tokens_per_tile} per tile; {parts}) with "
                f"--max-num-tiles {tiling.max_tiles}: {advice}")


def internvl_image_processor(model, enc) -> InternVLImageProcessor:
    """The InternVL family's processor (``model``: the run's model group): tiling from the
    encoder config (--img-h,
    --max-num-tiles, --use-thumbnail), ImageNet statistics or those of
    ``--image-processor-config`` (a GotOcr2 / InternVL preprocessor_config.json). One
    image at its most tiles must fit in --seq-length."""
    import json

    from ...config import ConfigError

    tiling = enc.tiling
    stats = {}
    path = model.image_processor_config
    if path:
        with open(path) as f:
            hf = json.load(f)
        for key, want in (("resample", 3), ("do_resize", True), ("do_rescale", True),
                          ("do_normalize", True), ("do_convert_rgb", True)):
            if hf.get(key, want) != want:  # 3: PIL's bicubic, as the tiling resizes
                raise ConfigError(f"--image-processor-config {path}: {key}={hf[key]!r} is "
                                  f"not supported (only {want!r})")
        size = hf.get("size") or {}
        if size.get("height", tiling.tile_size) != tiling.tile_size:
            raise ConfigError(f"--image-processor-config {path}: tile size {size} differs "
                              f"from --img-h {tiling.tile_size}")
        stats = dict(mean=tuple(hf.get("image_mean", IMAGENET_MEAN)),
                     std=tuple(hf.get("image_std", IMAGENET_STD)),
                     rescale_factor=hf.get("rescale_factor", 1 / 255))
    most = context_tokens(tiling.most_tiles, tiling)
    if most > model.seq_length:
        raise ConfigError(f"--max-num-tiles {tiling.max_tiles} lets one image take "
                          f"{tiling.most_tiles} tiles = {most} tokens, more than --seq-length "
                          f"{model.seq_length}")
    return InternVLImageProcessor(InternVLProcessorConfig(tiling, **stats))
