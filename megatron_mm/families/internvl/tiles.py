"""InternVL dynamic tiling geometry, pure Python: the tile grid an image is cut into, its
tile count (thumbnail included) and its placeholder token count.

The same arithmetic as transformers' ``GotOcr2ImageProcessor`` (``get_optimal_tiled_canvas``,
``crop_image_to_patches``) with ``crop_to_patches=True`` as ``InternVLProcessor`` calls it,
and as InternVL's own ``dynamic_preprocess``: among the grids of ``min_tiles``..``max_tiles``
tiles, take the one whose aspect ratio is closest to the image's; on a tie, the grid with
more tiles wins while the image's area exceeds half the grid's area. A grid of more than
one tile gets a thumbnail (the whole image resized to one tile) when ``use_thumbnail``.

The planner and the data balancer read per-sample vision work (tiles) from these numbers
without decoding a pixel; the pixel path (``megatron_mm.families.internvl.media``) uses the
same functions, so planned and real counts cannot drift apart.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ..errors import MediaGeometryError

# ImageNet statistics: the InternVL checkpoints' preprocessor_config.json use them.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class InternVLTiling:
    """Tiling fields (Megatron-LM's names: ``--max-num-tiles``, ``--use-thumbnail``).

    ``tile_size``: side of a square tile (the processor's ``size``, InternViT's
    ``image_size``); ``min_tiles`` / ``max_tiles``: the processor's ``min_patches`` /
    ``max_patches`` (the thumbnail is not counted); ``patch_size`` and
    ``downsample_ratio`` (pixel shuffle) give the LLM tokens per tile.
    """

    tile_size: int = 448
    min_tiles: int = 1
    max_tiles: int = 12
    use_thumbnail: bool = True
    patch_size: int = 14
    downsample_ratio: float = 0.5

    def __post_init__(self):
        for name in ("tile_size", "min_tiles", "max_tiles", "patch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.min_tiles > self.max_tiles:
            raise ValueError(f"min_tiles ({self.min_tiles}) > max_tiles ({self.max_tiles})")
        if self.tile_size % self.patch_size:
            raise ValueError(f"tile_size ({self.tile_size}) must be a multiple of patch_size "
                             f"({self.patch_size})")
        side = self.tile_size // self.patch_size * self.downsample_ratio
        if not self.downsample_ratio > 0 or side != int(side):
            raise ValueError(f"downsample_ratio {self.downsample_ratio} must turn the "
                             f"{self.tile_size // self.patch_size} patches per tile side into "
                             f"a whole number of tokens")

    @property
    def tokens_per_tile(self) -> int:
        """``image_seq_length``: (tile / patch)^2 * downsample_ratio^2 (256 for 448/14/0.5)."""
        return int(self.tile_size // self.patch_size * self.downsample_ratio) ** 2

    @property
    def most_tiles(self) -> int:
        """The largest tile count one image can take (thumbnail included)."""
        return self.max_tiles + (self.use_thumbnail and self.max_tiles > 1)


# <img> and </img> around each image's context tokens (InternVLProcessor.replace_image_token).
IMAGE_MARKER_TOKENS = 2


@lru_cache(maxsize=64)
def supported_grids(min_tiles: int, max_tiles: int) -> tuple[tuple[int, int], ...]:
    """(columns, rows) grids of min..max tiles, in transformers' order (by tile count,
    then columns): the order decides ties."""
    grids = [(c, r) for c in range(1, max_tiles + 1) for r in range(1, max_tiles + 1)
             if min_tiles <= c * r <= max_tiles]
    return tuple(sorted(grids, key=lambda g: g[0] * g[1]))


def optimal_grid(height: int, width: int, tiling: InternVLTiling,
                 context: str = "image") -> tuple[int, int]:
    """(columns, rows) of tiles the image is resized to and cut into."""
    if not (isinstance(height, int) and isinstance(width, int)) or height < 1 or width < 1:
        raise MediaGeometryError(f"{context}: image of size {height}x{width} has no pixels")
    if tiling.max_tiles == 1:  # transformers only crops when max_patches > 1
        return 1, 1
    aspect = width / height
    area = width * height
    tile_area = tiling.tile_size * tiling.tile_size
    best_diff, best = float("inf"), (1, 1)
    for grid in supported_grids(tiling.min_tiles, tiling.max_tiles):
        diff = abs(aspect - grid[0] / grid[1])
        if diff < best_diff:
            best_diff, best = diff, grid
        elif diff == best_diff and area > 0.5 * tile_area * grid[0] * grid[1]:
            best = grid
    return best


def tiles_of_grid(grid: tuple[int, int], tiling: InternVLTiling) -> int:
    """Tiles through the vision encoder for a grid: its cells, plus the thumbnail."""
    cells = grid[0] * grid[1]
    return cells + 1 if tiling.use_thumbnail and cells > 1 else cells


def tile_count(height: int, width: int, tiling: InternVLTiling, context: str = "image") -> int:
    """Tiles of one image of ``height`` x ``width`` (the processor's ``num_patches``)."""
    return tiles_of_grid(optimal_grid(height, width, tiling, context), tiling)


def context_tokens(tiles: int, tiling: InternVLTiling) -> int:
    """``<IMG_CONTEXT>`` tokens of an image of ``tiles`` tiles."""
    return tiles * tiling.tokens_per_tile


def image_tokens(tiles: int, tiling: InternVLTiling) -> int:
    """LLM tokens an image takes in the sequence: ``<img>``, its context tokens, ``</img>``."""
    return context_tokens(tiles, tiling) + IMAGE_MARKER_TOKENS


def sample_tokens(image_sizes, text_tokens: int, tiling: InternVLTiling) -> int:
    """Sequence length of a sample: its text tokens plus each image's tokens.
    ``image_sizes``: (height, width) per image."""
    return text_tokens + sum(image_tokens(tile_count(h, w, tiling), tiling)
                             for h, w in image_sizes)


def max_tiles_fitting(image_sizes, text_tokens: int, seq_length: int,
                      tiling: InternVLTiling) -> int | None:
    """The largest ``max_tiles`` (at least ``min_tiles``) for which the sample fits in
    ``seq_length`` tokens, or None when not even ``min_tiles`` fits."""
    for m in range(tiling.max_tiles, tiling.min_tiles - 1, -1):
        if sample_tokens(image_sizes, text_tokens, replace(tiling, max_tiles=m)) <= seq_length:
            return m
    return None


def check_sample_budget(image_sizes, text_tokens: int, seq_length: int,
                        tiling: InternVLTiling, context: str = "record") -> int:
    """The sample's token count; a MediaGeometryError naming ``context``, each image's
    tiles and the largest ``--max-num-tiles`` that would fit when it exceeds
    ``seq_length``."""
    total = sample_tokens(image_sizes, text_tokens, tiling)
    if total <= seq_length:
        return total
    parts = ", ".join(f"image {i} ({w}x{h}, width x height): {tile_count(h, w, tiling)} tiles"
                      for i, (h, w) in enumerate(image_sizes))
    fit = max_tiles_fitting(image_sizes, text_tokens, seq_length, tiling)
    advice = (f"lower --max-num-tiles to {fit} or raise --seq-length" if fit is not None else
              f"even {tiling.min_tiles} tile(s) per image do not fit: raise --seq-length or "
              f"drop the record")
    raise MediaGeometryError(
        f"{context}: needs {total} tokens ({text_tokens} text + {total - text_tokens} image, "
        f"{tiling.tokens_per_tile} per tile; {parts}) but --seq-length is {seq_length} with "
        f"--max-num-tiles {tiling.max_tiles}: {advice}")


def check_tiling_fits(seq_length: int, tiling: InternVLTiling) -> None:
    """Up-front flag check: one image at its most tiles must fit in ``seq_length``."""
    need = image_tokens(tiling.most_tiles, tiling)
    if need > seq_length:
        thumb = " (thumbnail included)" if tiling.most_tiles > tiling.max_tiles else ""
        raise MediaGeometryError(
            f"--max-num-tiles {tiling.max_tiles} lets one image take {tiling.most_tiles} "
            f"tiles{thumb} = {need} tokens, more than --seq-length {seq_length}")


def image_size_for_tiles(tiles: int, tiling: InternVLTiling) -> tuple[int, int]:
    """A (height, width) whose tiling gives exactly ``tiles`` tiles (thumbnail included):
    the squarest grid of that many cells at tile resolution. Used to synthesise images
    with the tile counts of real length statistics; an impossible count is an error (with
    a thumbnail, 2 tiles cannot happen: a 2-cell grid brings its thumbnail)."""
    cells = tiles - 1 if tiling.use_thumbnail and tiles > 2 else tiles
    candidates = sorted(((c, cells // c) for c in range(1, cells + 1) if cells % c == 0),
                        key=lambda g: (abs(g[0] - g[1]), -g[0]))
    for cols, rows in candidates:
        size = rows * tiling.tile_size, cols * tiling.tile_size
        if tile_count(*size, tiling) == tiles:
            return size
    raise MediaGeometryError(
        f"no image gives {tiles} tiles with min/max tiles {tiling.min_tiles}/"
        f"{tiling.max_tiles}, use_thumbnail={tiling.use_thumbnail}")
