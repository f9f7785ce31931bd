"""InternVL's tile grid, tile and token counts (pure Python) equal transformers'; the
sequence-length budget names the record and the --max-num-tiles that fits."""

import random
import subprocess
import sys

import pytest

from megatron_mm.families.internvl.tiles import (InternVLTiling, check_sample_budget,
                                                 check_tiling_fits, context_tokens,
                                                 image_size_for_tiles, image_tokens,
                                                 max_tiles_fitting, optimal_grid, sample_tokens,
                                                 supported_grids, tile_count)
from megatron_mm.families.errors import MediaGeometryError

# (min_tiles, max_tiles, tile_size)
BOUNDS = [(1, 12, 448), (1, 6, 448), (1, 4, 448), (2, 9, 448), (1, 2, 224), (3, 3, 448)]


def _sizes(n, seed=0):
    rng = random.Random(seed)
    sizes = [(rng.randint(1, 4000), rng.randint(1, 4000)) for _ in range(n)]
    sizes += [(rng.randint(1, 200), rng.randint(1, 200)) for _ in range(n // 4)]
    # exact grid aspect ratios at and around the tie threshold (area = half the canvas)
    sizes += [(r * s, c * s) for c in range(1, 7) for r in range(1, 7) for s in (100, 224, 317,
                                                                                 448, 896)]
    return sizes


def test_grid_and_tile_count_equal_transformers_on_many_sizes():
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (
        GotOcr2ImageProcessorPil, get_all_supported_aspect_ratios, get_optimal_tiled_canvas)

    for lo, hi, tile in BOUNDS:
        assert list(supported_grids(lo, hi)) == get_all_supported_aspect_ratios(lo, hi)
        hf = GotOcr2ImageProcessorPil(size={"height": tile, "width": tile},
                                      crop_to_patches=True, min_patches=lo, max_patches=hi)
        tiling = InternVLTiling(tile_size=tile, min_tiles=lo, max_tiles=hi,
                                patch_size=tile // 32)
        for h, w in _sizes(250):
            grid = optimal_grid(h, w, tiling)
            if hi > 1:
                assert grid == get_optimal_tiled_canvas((h, w), (tile, tile), lo, hi), (h, w)
            # transformers' count always adds the thumbnail to a grid of several tiles
            assert tile_count(h, w, tiling) == hf.get_number_of_image_patches(h, w), (h, w)


def test_known_grids_tokens_and_the_tie_rule():
    t = InternVLTiling(max_tiles=6)
    assert t.tokens_per_tile == 256 and t.most_tiles == 7
    assert optimal_grid(300, 900, t) == (3, 1) and tile_count(300, 900, t) == 4
    assert context_tokens(4, t) == 1024 and image_tokens(4, t) == 1026
    # a square: (1,1) first, a tie with (2,2) wins only when the image covers half of it
    assert optimal_grid(448, 448, t) == (1, 1)
    assert optimal_grid(634, 634, t) == (2, 2)  # 634^2 > 0.5 * 4 * 448^2
    assert optimal_grid(633, 633, t) == (1, 1)
    # no thumbnail: the grid alone
    assert tile_count(300, 900, InternVLTiling(max_tiles=6, use_thumbnail=False)) == 3
    # a tiny image is upscaled to many tiles when its aspect ratio matches a big grid
    assert tile_count(50, 60, InternVLTiling(max_tiles=12)) == 13
    assert tile_count(50, 60, InternVLTiling(max_tiles=4)) == 1
    # max_tiles 1: a plain resize to one tile
    assert tile_count(300, 4000, InternVLTiling(max_tiles=1)) == 1
    assert InternVLTiling(tile_size=224, patch_size=14, downsample_ratio=1.0).tokens_per_tile == 256


def test_sample_budget_names_the_record_and_the_tiles_that_fit():
    t = InternVLTiling(max_tiles=12)
    sizes = [(1200, 1600), (448, 448)]  # 12 tiles + thumbnail, and 1 tile
    assert sample_tokens(sizes, 100, t) == 100 + (13 * 256 + 2) + (256 + 2)
    assert check_sample_budget(sizes, 100, 4096, t, "record 'r1'") == 3688
    with pytest.raises(MediaGeometryError) as e:
        check_sample_budget(sizes, 100, 2048, t, "record 'r1' (a.jsonl line 3)")
    msg = str(e.value)
    assert msg.startswith("record 'r1' (a.jsonl line 3): needs 3688 tokens")
    assert "image 0 (1600x1200, width x height): 13 tiles" in msg
    assert "--seq-length is 2048 with --max-num-tiles 12" in msg
    fit = max_tiles_fitting(sizes, 100, 2048, t)
    assert f"lower --max-num-tiles to {fit} or raise --seq-length" in msg
    # the advised value fits and the next one does not
    assert sample_tokens(sizes, 100, InternVLTiling(max_tiles=fit)) <= 2048
    assert sample_tokens(sizes, 100, InternVLTiling(max_tiles=fit + 1)) > 2048
    with pytest.raises(MediaGeometryError, match="even 1 tile.*do not fit"):
        check_sample_budget(sizes, 100, 500, t, "record 'r1'")


def test_tiling_must_fit_the_sequence_length():
    check_tiling_fits(3330, InternVLTiling(max_tiles=12))
    with pytest.raises(MediaGeometryError,
                       match=r"--max-num-tiles 12 lets one image take 13 tiles \(thumbnail "
                             r"included\) = 3330 tokens, more than --seq-length 3329"):
        check_tiling_fits(3329, InternVLTiling(max_tiles=12))


@pytest.mark.parametrize("tiling", [InternVLTiling(max_tiles=4), InternVLTiling(max_tiles=12),
                                    InternVLTiling(max_tiles=6, use_thumbnail=False),
                                    InternVLTiling(min_tiles=2, max_tiles=9)])
def test_image_size_for_tiles_round_trips(tiling):
    possible = {tile_count(h, w, tiling) for h, w in _sizes(300, seed=1)}
    for tiles in range(1, tiling.most_tiles + 1):
        if tiles in possible:
            assert tile_count(*image_size_for_tiles(tiles, tiling), tiling) == tiles
    if tiling.use_thumbnail:
        with pytest.raises(MediaGeometryError, match="no image gives 2 tiles"):
            image_size_for_tiles(2, tiling)


def test_config_validates_itself():
    with pytest.raises(ValueError, match=r"min_tiles \(5\) > max_tiles \(4\)"):
        InternVLTiling(min_tiles=5, max_tiles=4)
    with pytest.raises(ValueError, match="tile_size .* multiple of patch_size"):
        InternVLTiling(tile_size=450)
    with pytest.raises(ValueError, match="whole number of tokens"):
        InternVLTiling(downsample_ratio=0.3)
    with pytest.raises(ValueError, match="max_tiles must be a positive integer"):
        InternVLTiling(max_tiles=0)
    with pytest.raises(MediaGeometryError, match="image 2: image of size 0x5 has no pixels"):
        tile_count(0, 5, InternVLTiling(), "image 2")


@pytest.mark.processes
def test_tiles_module_imports_no_torch():
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, megatron_mm.families.internvl.tiles\n"
         "assert 'torch' not in sys.modules"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
