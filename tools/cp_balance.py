"""Context-parallel balance of token assignments on multimodal mask families.

For each mask family (causal; prefix-LM; media blocks embedded between causal text spans;
packed documents mixing these) and sequence length, prints max / mean attention work per
CP rank (work = attention tiles of block x block tokens the rank's queries compute, plus
``--context-parallel-block-overhead`` tiles per block, the kernel's fixed cost) for the
contiguous, zigzag, LPT and our (LPT + local search) assignments: the worst over
``--seeds`` random masks of each family, so one lucky mask does not hide a bad one.
``bound`` is the lower bound of any block assignment (the heaviest block, or the mean).

Then the vision work per CP rank (patches through the vision encoder) with and without
``--vision-dp-when-cp`` on the Qwen2.5-VL native-resolution data of
``tools/bench_balance.py --family qwen2_5_vl`` (1-3 images of 28-336 px per sample, the
same draws), in micro-batches of ``--micro-batch-size`` samples: without it every rank
encodes every item; with it each rank encodes its share (``encoder_split.py``). Each
micro-batch waits for its busiest rank, so the figure is the busiest rank's work summed
over micro-batches against the mean's; ``bound``: the same for the least any split of
whole items can reach (the heaviest item, or the mean); ``worst``: the worst single
micro-batch.

With ``--hybrid-llm`` (a hybrid LLM of the model zoo, Qwen3.5-27B's: 48 Gated DeltaNet and
16 full-attention layers) it prints instead the whole LLM's forward work per CP rank for a
micro-batch of each mask (``plan/context_parallel/hybrid.py``): the full layers' attention
on the token assignment, every layer's projections and MLP on the rank's tokens, the Gated
DeltaNet layers' rule per head group; and the bytes each GDN layer's two all-to-alls
(sequence shards to head shards and back) move on the busiest rank, per layer and per
micro-batch (every GDN layer, forward and backward), with their time at
``--a2a-bandwidth-gbps``.

    python tools/cp_balance.py --context-parallel-size 8 --seq-lengths 16384 32768 65536
    python tools/cp_balance.py --hybrid-llm qwen3.5-27b --context-parallel-size 2 4 \
        --seq-lengths 32768 131072 --families causal packed

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
from megatron_mm.plan.context_parallel.encoder_split import split_items  # noqa: E402
from megatron_mm.plan.context_parallel.hybrid import (  # noqa: E402
    gdn_step_seconds, hybrid_cp_balance)
from megatron_mm.plan.costs.hardware import H100  # noqa: E402
from megatron_mm.plan.errors import PlanError  # noqa: E402
from megatron_mm.reproductions.model_zoo import LLMS  # noqa: E402
from megatron_mm.reproductions.mask_families import FAMILIES, family_codes  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other benchmarks' helpers
from bench_balance import native_resolution_image_sizes  # noqa: E402

PATCH = 14  # Qwen2.5-VL's patch side in pixels


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context-parallel-size", type=int, nargs="+", default=[8],
                   help="CP size(s); the attention table takes the first")
    p.add_argument("--seq-lengths", type=int, nargs="+", default=[16384, 32768, 65536])
    p.add_argument("--context-parallel-block", type=int, default=128)
    p.add_argument("--context-parallel-block-overhead", type=float, default=BLOCK_OVERHEAD,
                   help="fixed cost of one query block, in attention tiles")
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--seeds", type=int, default=3, help="random masks per family and length")
    p.add_argument("--vision-cp-sizes", type=int, nargs="+", default=[2, 4, 8],
                   help="CP sizes of the vision work table")
    p.add_argument("--micro-batch-size", type=int, default=4,
                   help="samples per micro-batch of the vision work table")
    p.add_argument("--samples", type=int, default=1000,
                   help="records of the native-resolution data (bench_balance --samples)")
    p.add_argument("--max-side", type=int, default=336,
                   help="largest image side of that data (bench_balance --max-side)")
    hybrid = sorted(n for n, t in LLMS.items() if t.linear_attention is not None)
    p.add_argument("--hybrid-llm", choices=hybrid, default=None,
                   help="print the hybrid LLM's work and Gated DeltaNet traffic per CP rank")
    p.add_argument("--tensor-model-parallel-size", type=int, default=1,
                   help="with --hybrid-llm: TP (the heads and channels per rank)")
    p.add_argument("--a2a-bandwidth-gbps", type=float, default=360.0,
                   help="with --hybrid-llm: GB/s per GPU of the CP group's all-to-alls "
                        "(default: NVLink 4 within a node, the planner's tp_bandwidth)")
    return p


HYBRID_METHODS = ("zigzag", "ours")


def hybrid_table(llm_name: str, cp_sizes: Sequence[int], lengths: Sequence[int],
                 block: int, families: Sequence[str], seeds: int, tp: int = 1,
                 block_overhead: float = BLOCK_OVERHEAD) -> List[dict]:
    """Per CP size, mask family, length and method: the worst over ``seeds`` masks of the
    max / mean attention work and whole-LLM work per rank, the GDN layers' share of the
    work, and the busiest rank's GDN all-to-all bytes (``hybrid_cp_balance``)."""
    llm = LLMS[llm_name]
    rows = []
    for cp in cp_sizes:
        for family in families:
            for s in lengths:
                for m in HYBRID_METHODS:
                    runs = [hybrid_cp_balance(llm, family_codes(family, s, seed), cp, m,
                                              block, block_overhead, tp)
                            for seed in range(seeds)]
                    worst = max(runs, key=lambda r: r.imbalance())
                    total = sum(worst.total_flops)
                    rows.append({"cp": cp, "family": family, "seq_length": s, "method": m,
                                 "attention": max(r.imbalance("attention_flops")
                                                  for r in runs),
                                 "llm": worst.imbalance(),
                                 "attention_share": sum(worst.attention_flops) / total,
                                 "a2a_layer_bytes": worst.a2a_bytes,
                                 "a2a_step_bytes": worst.step_a2a_bytes(),
                                 "balance": worst})
    return rows


def print_hybrid(args) -> None:
    cps, tp = args.context_parallel_size, args.tensor_model_parallel_size
    rows = hybrid_table(args.hybrid_llm, cps, args.seq_lengths, args.context_parallel_block,
                        args.families, args.seeds, tp, args.context_parallel_block_overhead)
    llm = rows[0]["balance"]
    bandwidth = args.a2a_bandwidth_gbps * 1e9
    print(f"{args.hybrid_llm}: {llm.gdn_layers} Gated DeltaNet + {llm.full_layers} full-"
          f"attention layers, TP {tp}, block {args.context_parallel_block}; one micro-batch "
          f"(1 sequence), forward work per CP rank, worst of {args.seeds} masks; GDN "
          f"all-to-alls on the busiest rank, bf16, at {args.a2a_bandwidth_gbps:g} GB/s "
          f"(forward + backward); compute: the busiest rank's forward + backward (3x its "
          f"forward FLOPs) on {H100.name} at {H100.efficiency:g} of peak")
    print("| CP | family | seq | method | attention max/mean | LLM max/mean | attention "
          "share | a2a MiB per GDN layer | a2a GiB per micro-batch | a2a s | compute s | "
          "a2a / compute |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        a2a = gdn_step_seconds(r["balance"], bandwidth)
        compute = H100.seconds(3 * max(r["balance"].total_flops))  # forward + backward
        print(f"| {r['cp']} | {r['family']} | {r['seq_length']} | {r['method']} | "
              f"{r['attention']:.3f} | {r['llm']:.3f} | {r['attention_share']:.3f} | "
              f"{r['a2a_layer_bytes'] / 2 ** 20:.1f} | {r['a2a_step_bytes'] / 2 ** 30:.2f} | "
              f"{a2a:.3f} | {compute:.2f} | {a2a / compute:.3f} |")


def vision_work_table(cp_sizes: Sequence[int], samples: int, max_side: int,
                      micro_batch_size: int) -> List[dict]:
    """Per CP size: vision work (patches) per rank and micro-batch without the split
    (every item on every rank) and with it (the busiest rank, the mean), and their
    ratios."""
    sizes = native_resolution_image_sizes(samples, max_side)
    batches = [[(w // PATCH) * (h // PATCH) for sample in sizes[i:i + micro_batch_size]
                for w, h in sample]
               for i in range(0, len(sizes) - micro_batch_size + 1, micro_batch_size)]
    rows = []
    for cp in cp_sizes:
        splits = [split_items(work, cp) for work in batches]
        every = sum(sum(work) for work in batches)
        busiest = sum(max(s.work) for s in splits)
        # no split of whole items beats the heaviest item (or the mean)
        bound = sum(max(max(work), sum(work) / cp) for work in batches)
        rows.append({"cp": cp, "micro_batches": len(batches), "bound": bound * cp / every,
                     "without": every / len(batches), "busiest": busiest / len(batches),
                     "mean": every / cp / len(batches), "ratio": busiest * cp / every,
                     "worst": max(s.imbalance() for s in splits)})
    return rows


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
    parser = build_parser()
    args = parser.parse_args(argv)
    if (min(args.context_parallel_size) < 1 or args.context_parallel_block < 1
            or args.seeds < 1):
        parser.error("--context-parallel-size, --context-parallel-block and --seeds "
                     "must be >= 1")
    if args.context_parallel_block_overhead < 0:
        parser.error("--context-parallel-block-overhead must be >= 0")
    if args.hybrid_llm:
        try:
            print_hybrid(args)
        except PlanError as e:
            parser.error(str(e))
        return 0
    cp = args.context_parallel_size[0]
    rows = table(cp, args.seq_lengths, args.context_parallel_block,
                 args.families, args.seeds, args.context_parallel_block_overhead)
    print(f"max/mean attention work per rank, {cp} ranks, "
          f"block {args.context_parallel_block} (+ {args.context_parallel_block_overhead:g} "
          f"tiles each), worst of {args.seeds} masks")
    columns = METHODS + ("bound",)
    print(f"{'family':<18}{'seq':>7}" + "".join(f"{m:>12}" for m in columns))
    for r in rows:
        print(f"{r['family']:<18}{r['seq_length']:>7}"
              + "".join(f"{r[m]:>12.3f}" for m in columns))
    vision = vision_work_table(args.vision_cp_sizes, args.samples, args.max_side,
                               args.micro_batch_size)
    print(f"\nvision work per CP rank (patches per micro-batch), Qwen2.5-VL native-resolution "
          f"data ({args.samples} samples, 1-3 images of 28-{args.max_side} px each), "
          f"{args.micro_batch_size} samples per micro-batch ({vision[0]['micro_batches']})")
    print("| CP | without --vision-dp-when-cp (every rank) | with: busiest rank | with: mean "
          "| busiest / without | busiest / mean | bound | worst micro-batch |")
    print("|---|---|---|---|---|---|---|---|")
    for r in vision:
        print(f"| {r['cp']} | {r['without']:.1f} | {r['busiest']:.1f} | {r['mean']:.1f} | "
              f"{r['busiest'] / r['without']:.3f} | {r['ratio']:.3f} | {r['bound']:.3f} | "
              f"{r['worst']:.3f} |")
    for r in vision:
        print(f"vision work of the busiest CP rank / mean with --vision-dp-when-cp, "
              f"CP={r['cp']}: {r['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
