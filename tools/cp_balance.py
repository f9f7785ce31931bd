"""Context-parallel balance of token assignments on multimodal mask families.

For each mask family (causal; prefix-LM; media blocks embedded between causal text spans;
packed documents mixing these) and sequence length, prints max / mean attention work per
CP rank (work = attention tiles of block x block tokens the rank's queries compute, plus
``--context-parallel-block-overhead`` tiles per block, the kernel's fixed cost) for the
contiguous, zigzag, LPT and our (LPT + local search) assignments: the worst over
``--seeds`` random masks of each family, so one lucky mask does not hide a bad one.
``bound`` is the lower bound of any block assignment (the heaviest block, or the mean).

    python tools/cp_balance.py --context-parallel-size 8 --seq-lengths 16384 32768 65536

Pure Python + numpy, no torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron_mm.plan.context_parallel.cp_assignment import (  # noqa: E402
    BLOCK_OVERHEAD, METHODS, assign_tokens, block_loads)
from megatron_mm.reproductions.mask_families import FAMILIES, family_codes  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context-parallel-size", type=int, default=8)
    p.add_argument("--seq-lengths", type=int, nargs="+", default=[16384, 32768, 65536])
    p.add_argument("--context-parallel-block", type=int, default=128)
    p.add_argument("--context-parallel-block-overhead", type=float, default=BLOCK_OVERHEAD,
                   help="fixed cost of one query block, in attention tiles")
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--seeds", type=int, default=3, help="random masks per family and length")
    return p


def table(cp: int, lengths: Sequence[int], block: int, families: Sequence[str],
          seeds: int, block_overhead: float = BLOCK_OVERHEAD) -> List[dict]:
    rows = []
    for family in families:
        for s in lengths:
            worst = {m: 1.0 for m in METHODS + ("bound",)}
            for seed in range(seeds):
                codes = family_codes(family, s, seed)
                for m in METHODS:
                    a = assign_tokens(codes, cp, m, block=block,
                                      block_overhead=block_overhead)
                    worst[m] = max(worst[m], a.imbalance("cost"))
                # No assignment of whole blocks beats its heaviest block.
                tiles, _ = block_loads(codes, block)
                cost = tiles + block_overhead
                mean = cost.sum() / cp
                worst["bound"] = max(worst["bound"], max(cost.max(), mean) / mean)
            rows.append({"family": family, "seq_length": s, **worst})
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.context_parallel_size < 1 or args.context_parallel_block < 1 or args.seeds < 1:
        raise SystemExit("--context-parallel-size, --context-parallel-block and --seeds "
                         "must be >= 1")
    if args.context_parallel_block_overhead < 0:
        raise SystemExit("--context-parallel-block-overhead must be >= 0")
    rows = table(args.context_parallel_size, args.seq_lengths, args.context_parallel_block,
                 args.families, args.seeds, args.context_parallel_block_overhead)
    print(f"max/mean attention work per rank, {args.context_parallel_size} ranks, "
          f"block {args.context_parallel_block} (+ {args.context_parallel_block_overhead:g} "
          f"tiles each), worst of {args.seeds} masks")
    columns = METHODS + ("bound",)
    print(f"{'family':<18}{'seq':>7}" + "".join(f"{m:>12}" for m in columns))
    for r in rows:
        print(f"{r['family']:<18}{r['seq_length']:>7}"
              + "".join(f"{r[m]:>12.3f}" for m in columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
