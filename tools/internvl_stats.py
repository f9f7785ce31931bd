"""InternVL per-sample work of real length statistics: tiles and LLM tokens.

Reads OmniBal's per-sample statistics (JSON lists, optionally gzip, of {"vit_num": tiles,
"token_num": tokens, "image_flags": real tiles}; files or directories of them), checks
each tile count against the tiling (--max-num-tiles, thumbnail), and prints per file and
for all files together the mean, p50, p90 and max of the tiles, the LLM tokens and their
image / text parts, then the samples per tile count and an image size that the tiling cuts
into that many tiles (what a benchmark synthesises).

    python tools/internvl_stats.py STATS_DIR --max-num-tiles 4

Pure Python, no torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron_mm.plan import PlanError  # noqa: E402
from megatron_mm.families.internvl.work import (  # noqa: E402
                                                read_internvl_stats, summary_rows, tile_histogram)
from megatron_mm.plan.balance.loads import stats_files  # noqa: E402
from megatron_mm.families.internvl.tiles import InternVLTiling  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", help="statistics files or directories of them")
    p.add_argument("--max-num-tiles", type=int, default=4,
                   help="tiles per image, thumbnail not counted (InternVL-Chat-1.5's SFT "
                        "statistics are consistent with 4)")
    p.add_argument("--no-thumbnail", action="store_true",
                   help="no thumbnail tile for images of several tiles")
    p.add_argument("--img-h", type=int, default=448, help="tile side in pixels")
    p.add_argument("--patch-dim", type=int, default=14)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        tiling = InternVLTiling(tile_size=args.img_h, max_tiles=args.max_num_tiles,
                                use_thumbnail=not args.no_thumbnail, patch_size=args.patch_dim)
        files = [f for p in args.paths
                 for f in (stats_files(p) if os.path.isdir(p) else [os.fspath(p)])]
        per_file = [(os.path.basename(f), read_internvl_stats(f, tiling)) for f in files]
    except (PlanError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    everything = [w for _, works in per_file for w in works]
    print("| file | samples | quantity | mean | p50 | p90 | max |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for name, works in per_file + [("all", everything)]:
        for quantity, mean, p50, p90, top in summary_rows(works):
            print(f"| {name} | {len(works)} | {quantity} | {mean:.1f} | {p50} | {p90} | {top} |")
    print()
    print("| tiles | samples | share | image size (h x w) giving them |")
    print("| ---: | ---: | ---: | --- |")
    for tiles, count in tile_histogram(everything).items():
        h, w = next(x for x in everything if x.tiles == tiles).image_size(tiling)
        print(f"| {tiles} | {count} | {count / len(everything):.3f} | {h} x {w} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
