"""Data balance across data-parallel ranks: random, length-sorted, ISF and sorted ISF.

Reads per-sample statistics (OmniBal's format: JSON lists, optionally gzip, of
{"vit_num": tiles, "token_num": tokens, ...}; files or directories of them, taken together
as one dataset) and prints, for a data-parallel size and a target of samples per
micro-batch, the padding ratio and the vision and LLM imbalance across ranks of:

  random        shuffled micro-batches of B samples, padded to their longest
  length-sorted micro-batches of B samples of neighbouring length, in random order
  isf           OmniBal's ISF packed groups (bounds searched), placed on ranks at random
  isf-sorted    the same groups, placed so each step's ranks get groups of nearly equal
                (tiles, tokens): `--data-balance isf-sorted`, the training default

Metrics (OmniBal's), per step of one micro-batch per rank, averaged over steps:
  padding ratio    sum_i (t_max - t_i) / (t_max * B) over a rank's B samples padded to
                   the longest, t_max; mean over ranks; 0 for packed sequences
  imbalance        sum_r (T_max - T_r) / (T_max * N) over the N ranks, T_r a rank's
                   vision tiles (vision) or LLM tokens computed, pad included (LLM)

    python tools/balance.py STATS_DIR --data-parallel-size 8 --micro-batch-size 4

Pure Python, no torch. Bounds are searched per dataset (megatron_mm/plan/balance/search.py)
unless --data-balance-bounds gives them.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron_mm.plan import PlanError  # noqa: E402
from megatron_mm.plan.balance import (  # noqa: E402
    METHODS, ROUNDS, Bounds, isf, length_sorted_batches, measure, random_batches,
    read_all, search_bounds, steps_of)
from megatron_mm.plan.balance.search import parse_bounds  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stats", nargs="+", help="statistics files or directories of them")
    p.add_argument("--data-parallel-size", type=int, default=8)
    p.add_argument("--micro-batch-size", type=float, default=4,
                   help="samples per micro-batch (the target mean for packed groups)")
    p.add_argument("--data-balance-bounds", default="auto",
                   help="auto (searched per method) or Q_v,Q_t[,Q'_v,Q'_t]")
    p.add_argument("--data-balance-iters", type=int, default=10, help="ISF iterations T")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    return p


def rows(loads, dp: int, per_mb: float, bounds: Optional[Bounds], iterations: int,
         seed: int) -> List[dict]:
    out = []
    b = max(1, round(per_mb))
    for name, make in (("random", random_batches), ("length-sorted", length_sorted_batches)):
        m = measure(steps_of(make(loads, b, random.Random(f"{seed}:{name}")), dp), loads,
                    packed=False)
        out.append(dict(batching=name, bounds=f"{b} samples", oversize=0, **vars(m)))
    for method in METHODS:
        chosen = bounds or search_bounds(loads, dp, per_mb, method, iterations, seed).bounds
        rng = random.Random(f"{seed}:{method}")
        grouping = isf(range(len(loads)), loads, chosen, iterations, rng)
        m = measure(ROUNDS[method](grouping.groups, loads, dp, rng), loads, packed=True)
        out.append(dict(batching=method, bounds=f"{chosen.max_vision}/{chosen.max_tokens}"
                        f" ({chosen.full_vision}/{chosen.full_tokens})",
                        oversize=len(grouping.oversize), **vars(m)))
    return out


def table(rows_: Sequence[dict]) -> str:
    head = ("| batching | bounds tiles/tokens (full at) | samples / micro-batch | padding "
            "ratio | vision imbalance | LLM imbalance | steps | oversize |")
    lines = [head, "|" + "---|" * 8]
    for r in rows_:
        lines.append(f"| {r['batching']} | {r['bounds']} | {r['samples_per_microbatch']:.2f} "
                     f"| {r['padding']:.3f} | {r['vision_imbalance']:.4f} "
                     f"| {r['llm_imbalance']:.4f} | {r['steps']} | {r['oversize']} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.data_parallel_size < 1 or args.micro_batch_size < 1:
            raise PlanError("--data-parallel-size and --micro-batch-size must be >= 1")
        bounds = parse_bounds(args.data_balance_bounds)
        loads = read_all(args.stats)
    except (PlanError, OSError, ValueError) as e:
        parser.error(str(e))
    print(f"{len(loads)} samples, {sum(l.vision for l in loads)} tiles, "
          f"{sum(l.tokens for l in loads)} tokens; data-parallel size "
          f"{args.data_parallel_size}, {args.micro_batch_size:g} samples per micro-batch")
    try:
        result = rows(loads, args.data_parallel_size, args.micro_batch_size, bounds,
                      args.data_balance_iters, args.seed)
    except PlanError as e:
        parser.error(str(e))
    print(table(result))
    for r in result:
        if r["oversize"]:
            print(f"{r['batching']}: {r['oversize']} samples exceed the bounds on their own "
                  "(tiles > Q_v or tokens > Q_t) and are left out of its figures")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
