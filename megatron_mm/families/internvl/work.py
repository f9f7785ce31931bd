"""Per-sample InternVL work from real length statistics or from image sizes, pure Python.

OmniBal's statistics of InternVL-Chat-1.5's SFT mix hold, per sample, ``vit_num`` (tiles
through InternViT, thumbnail included; a text-only sample counts one dummy tile),
``token_num`` (the full LLM sequence, 256 ``<IMG_CONTEXT>`` tokens per tile included) and
``image_flags`` (how many of the tiles are real). They hold no image sizes: the tile count
is the fact. This module splits each sample into vision work (tiles, ViT patches) and LLM
work (text and image tokens), checks that every tile count is one the tiling can produce,
and gives an image size that the tiling (``megatron_mm.families.internvl.tiles``) cuts into
exactly that many tiles, so benchmarks can synthesise images with the real distribution.
Samples with real image sizes go through the same geometry (:func:`work_from_sizes`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Dict, Iterable, List, Sequence

from ...plan.balance.loads import SampleLoad, open_stats, stats_files
from ...plan.errors import PlanError
from ..errors import MediaGeometryError
from .tiles import (InternVLTiling, context_tokens, image_size_for_tiles,
                    image_tokens, tile_count)


@dataclass(frozen=True)
class InternVLWork:
    """One sample's work: ``tiles`` through the vision encoder, ``tokens`` of the LLM
    sequence, of which ``image_tokens`` are ``<IMG_CONTEXT>`` tokens and the rest text
    (chat template and image markers included)."""

    tiles: int
    tokens: int
    image_tokens: int
    real_tiles: int  # tiles of real images (0 for a text-only sample's dummy tile)

    @property
    def text_tokens(self) -> int:
        return self.tokens - self.image_tokens

    @property
    def load(self) -> SampleLoad:
        """What the data balancer reads (``megatron_mm.plan.balance``)."""
        return SampleLoad(self.tiles, self.tokens)

    def vit_patches(self, tiling: InternVLTiling) -> int:
        """Patch tokens through the vision encoder (class tokens not counted)."""
        return self.tiles * (tiling.tile_size // tiling.patch_size) ** 2

    def image_size(self, tiling: InternVLTiling) -> tuple[int, int]:
        """A (height, width) the tiling cuts into ``tiles`` tiles (for synthetic images)."""
        return image_size_for_tiles(self.tiles, tiling)


def work_from_sizes(image_sizes: Sequence[tuple[int, int]], text_tokens: int,
                    tiling: InternVLTiling) -> InternVLWork:
    """A sample's work from its images' (height, width) and its text tokens (markers
    excluded: ``<img>``/``</img>`` are added per image here)."""
    tiles = [tile_count(h, w, tiling) for h, w in image_sizes]
    total = text_tokens + sum(image_tokens(n, tiling) for n in tiles)
    return InternVLWork(sum(tiles), total, context_tokens(sum(tiles), tiling), sum(tiles))


def read_internvl_stats(path: str | os.PathLike, tiling: InternVLTiling) -> List[InternVLWork]:
    """One statistics file; a record the tiling cannot produce (a tile count no image
    gives, fewer tokens than its tiles' context tokens) is a PlanError naming the file and
    the record's index."""
    path = os.fspath(path)
    with open_stats(path) as f:
        records = json.load(f)
    if not isinstance(records, list):
        raise PlanError(f"{path}: expected a JSON list of per-sample records")
    possible: Dict[int, bool] = {}
    out = []
    for i, rec in enumerate(records):
        try:
            tiles, tokens = rec["vit_num"], rec["token_num"]
            real = rec.get("image_flags", tiles)
        except (KeyError, TypeError, AttributeError):
            raise PlanError(f"{path}: record {i} lacks vit_num / token_num: {rec!r}") from None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (tiles, tokens, real)) \
                or tiles < 1 or not 0 <= real <= tiles:
            raise PlanError(f"{path}: record {i} has vit_num={tiles!r}, token_num={tokens!r}, "
                            f"image_flags={real!r} (need integers, vit_num >= 1, "
                            f"0 <= image_flags <= vit_num)")
        if tiles not in possible:
            try:
                image_size_for_tiles(tiles, tiling)
                possible[tiles] = True
            except MediaGeometryError:
                possible[tiles] = False
        if not possible[tiles] and real:
            raise PlanError(
                f"{path}: record {i} has {tiles} tiles, which no image gives with "
                f"--max-num-tiles {tiling.max_tiles} (use_thumbnail={tiling.use_thumbnail})")
        image = context_tokens(tiles, tiling)
        if tokens < image:
            raise PlanError(f"{path}: record {i} has token_num={tokens}, fewer than the "
                            f"{image} context tokens of its {tiles} tiles "
                            f"({tiling.tokens_per_tile} per tile)")
        out.append(InternVLWork(tiles, tokens, image, real))
    return out


def read_all_internvl(paths: Iterable[str | os.PathLike],
                      tiling: InternVLTiling) -> List[InternVLWork]:
    """Several files (or directories of files) as one dataset, in the order given."""
    works: List[InternVLWork] = []
    for p in paths:
        for f in stats_files(p) if os.path.isdir(p) else [os.fspath(p)]:
            works += read_internvl_stats(f, tiling)
    return works


def percentile(values: Sequence[int], q: float) -> int:
    """Nearest-rank percentile (a value of the data)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summary_rows(works: Sequence[InternVLWork]) -> List[tuple]:
    """(quantity, mean, p50, p90, max) rows: tiles, LLM tokens, image and text tokens."""
    if not works:
        raise PlanError("no samples to summarise")
    columns = (("tiles", [w.tiles for w in works]),
               ("LLM tokens", [w.tokens for w in works]),
               ("image tokens", [w.image_tokens for w in works]),
               ("text tokens", [w.text_tokens for w in works]))
    return [(name, sum(v) / len(v), percentile(v, 50), percentile(v, 90), max(v))
            for name, v in columns]


def tile_histogram(works: Sequence[InternVLWork]) -> Dict[int, int]:
    """Samples per tile count, by tile count."""
    hist: Dict[int, int] = {}
    for w in works:
        hist[w.tiles] = hist.get(w.tiles, 0) + 1
    return dict(sorted(hist.items()))
