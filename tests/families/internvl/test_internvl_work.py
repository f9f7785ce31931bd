"""InternVL per-sample work: read from OmniBal's real statistics (a slice of each file,
../shared/data/omnibal_lengths, skipped where absent) and from image sizes, checked against
the tiling; the summary tool without torch."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_mm.plan import PlanError
from megatron_mm.plan.balance import read_length_stats
from megatron_mm.families.internvl.work import (InternVLWork, percentile,
                                                read_all_internvl, read_internvl_stats,
                                                summary_rows, tile_histogram,
                                                work_from_sizes)
from megatron_mm.families.internvl.tiles import InternVLTiling, tile_count

ROOT = Path(__file__).resolve().parents[3]
# the data sits beside the checkout, or beside the folder of worktrees
REAL = next((p for p in (ROOT.parent / "shared" / "data" / "omnibal_lengths",
                         ROOT.parent.parent / "shared" / "data" / "omnibal_lengths")
             if p.is_dir()), None)
TILING = InternVLTiling(max_tiles=4)


def _write(path, records):
    with gzip.open(path, "wt") as f:
        json.dump(records, f)
    return path


@pytest.fixture(scope="module")
def real_slice(tmp_path_factory):
    if REAL is None:
        pytest.skip("../shared/data/omnibal_lengths not present")
    out = tmp_path_factory.mktemp("omnibal")
    for f in sorted(REAL.glob("*.json.gz")):
        with gzip.open(f, "rt") as fh:
            _write(out / f.name, json.load(fh)[:3000])
    return out


def test_real_statistics_slice(real_slice):
    works = read_all_internvl([real_slice], TILING)
    files = sorted(real_slice.glob("*.json.gz"))
    assert len(files) == 4 and len(works) == 4 * 3000
    # the same loads as the balancer's own reader
    loads = [l for f in files for l in read_length_stats(f)]
    assert [w.load for w in works] == loads
    for w in works:
        assert w.image_tokens == 256 * w.tiles and w.text_tokens >= 1
        assert w.vit_patches(TILING) == 1024 * w.tiles
    # every tile count is one of max 4 tiles with a thumbnail: 1 (a single tile, no
    # thumbnail), cells + 1; never 2, which a thumbnail rules out
    hist = tile_histogram(works)
    assert set(hist) <= {1, 3, 4, 5} and 2 not in hist and sum(hist.values()) == len(works)
    for tiles in hist:
        h, w = next(x for x in works if x.tiles == tiles).image_size(TILING)
        assert tile_count(h, w, TILING) == tiles
    rows = {r[0]: r[1:] for r in summary_rows(works)}
    mean, p50, p90, top = rows["tiles"]
    assert 1 <= p50 <= p90 <= top == 5 and 1 < mean < 5
    assert rows["LLM tokens"][3] == max(l.tokens for l in loads)
    # a tiling that cannot produce 5 tiles is refused, naming the file and the record
    with pytest.raises(PlanError, match=r"ai2d.*: record 2 has 5 tiles, which no image "
                                        r"gives with --max-num-tiles 2"):
        read_internvl_stats(files[0], InternVLTiling(max_tiles=2))


def test_bad_records_are_named(tmp_path):
    f = _write(tmp_path / "a.json.gz", [{"vit_num": 1, "token_num": 300, "image_flags": 1},
                                        {"vit_num": 2, "token_num": 600, "image_flags": 2}])
    with pytest.raises(PlanError, match=r"a.json.gz: record 1 has 2 tiles, which no image"):
        read_internvl_stats(f, TILING)
    # without a thumbnail 2 tiles are a 2x1 grid
    assert [w.tiles for w in read_internvl_stats(f, InternVLTiling(use_thumbnail=False))] == [1, 2]
    f = _write(tmp_path / "b.json.gz", [{"vit_num": 3, "token_num": 700}])
    with pytest.raises(PlanError, match="record 0 has token_num=700, fewer than the 768 "
                                        "context tokens of its 3 tiles"):
        read_internvl_stats(f, TILING)
    f = _write(tmp_path / "c.json.gz", [{"vit_num": 0, "token_num": 70}])
    with pytest.raises(PlanError, match="record 0 has vit_num=0"):
        read_internvl_stats(f, TILING)
    f = _write(tmp_path / "d.json.gz", [{"token_num": 70}])
    with pytest.raises(PlanError, match="record 0 lacks vit_num"):
        read_internvl_stats(f, TILING)


def test_work_from_image_sizes_and_summary():
    # a 300x900 image (3x1 grid + thumbnail = 4 tiles) and a square one (1 tile)
    w = work_from_sizes([(300, 900), (448, 448)], 50, InternVLTiling(max_tiles=6))
    assert w == InternVLWork(tiles=5, tokens=50 + 4 * 256 + 2 + 256 + 2, image_tokens=5 * 256,
                             real_tiles=5)
    assert w.text_tokens == 54  # the text and the two images' <img> </img>
    works = [InternVLWork(t, 300 * t, 256 * t, t) for t in (1, 1, 3, 5, 5, 5, 5, 4, 3, 5)]
    tiles = summary_rows(works)[0]
    assert tiles == ("tiles", 3.7, 4, 5, 5)
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90) == 9
    assert percentile([7], 50) == 7
    assert tile_histogram(works) == {1: 2, 3: 2, 4: 1, 5: 5}


@pytest.mark.processes
def test_summary_tool_without_torch(tmp_path):
    _write(tmp_path / "x.json.gz", [{"vit_num": t, "token_num": 256 * t + 40}
                                    for t in (1, 3, 5, 5)])
    code = ("import runpy, sys\n"
            f"sys.argv = ['internvl_stats', {str(tmp_path)!r}]\n"
            "try:\n"
            f"    runpy.run_path({str(ROOT / 'tools' / 'internvl_stats.py')!r}, "
            "run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "assert 'torch' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "| all | 4 | tiles | 3.5 | 3 | 5 | 5 |" in proc.stdout
    assert "| 5 | 2 | 0.500 | 896 x 896 |" in proc.stdout
