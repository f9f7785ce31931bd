"""Measured CP attention time per rank against the planned balance (gloo, this machine).

    python tools/bench_cp_attention.py [--family encoder_embedded] [--seq-length 4096]
    python tools/bench_cp_attention.py --calibrate   # the per-block fixed cost

Four ranks (one thread each) run ``ContextParallelAttention`` on one mask of ``--family``
for each token assignment (contiguous, zigzag, LPT, ours). K and V are all-gathered once
outside the timed region; each rank then times its own attention work, forward and
backward over its query runs (what the plan's tiles count), median over ``--iters``, the
ranks taking turns so that each timing has a core to itself. Prints per rank the planned
tiles, tokens and measured milliseconds, and max/mean of planned tiles, of the planned
attention time (tiles + ``--context-parallel-block-overhead`` per block) and of measured.

``--calibrate`` measures that overhead instead (one process, no ranks): forward + backward
of one query block against 1, 2, 3, ... causal key tiles of a ``--seq-length`` sequence
(minimum over ``--iters``), a least-squares fit of
ms = a * tiles + b, and b / a, the fixed cost of a block in tiles (the default of
``--context-parallel-block-overhead``, ``plan.cp_assignment.BLOCK_OVERHEAD``).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

METHODS = ("contiguous", "zigzag", "lpt", "ours")



def _clock() -> float:
    """``perf_counter`` after the device's queued work (CUDA kernels return before they
    run, so an unsynchronised clock measures their launches)."""
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.runtime.timer import device_clock
    from megatron_mm.training.initialize import device

    return device_clock(device())

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="encoder_embedded",
                   choices=["causal", "prefix_lm", "encoder_embedded", "packed"])
    p.add_argument("--seq-length", type=int, default=4096)
    p.add_argument("--context-parallel-size", type=int, default=4)
    p.add_argument("--context-parallel-block", type=int, default=128)
    p.add_argument("--context-parallel-block-overhead", type=float, default=None,
                   help="tiles per block in the load model (default: BLOCK_OVERHEAD)")
    p.add_argument("--calibrate", action="store_true",
                   help="measure the per-block fixed cost instead")
    p.add_argument("--calibrate-tiles", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 12, 16],
                   help="key tiles per timed block with --calibrate")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    return p


def _worker(rank, args, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(args.context_parallel_size))
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    import torch
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_mm.models.context_parallel import context_parallel_mask
    from megatron_mm.models.cp_attention import ContextParallelAttention, _PendingGather
    from megatron_mm.reproductions.mask_families import family_codes

    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    parallel_state.initialize_model_parallel(1, 1)
    group = torch.distributed.group.WORLD
    h, d, s = args.heads, args.head_dim, args.seq_length
    config = TransformerConfig(num_layers=1, hidden_size=h * d, num_attention_heads=h,
                               kv_channels=d, attention_dropout=0.0)
    attn = ContextParallelAttention(config, 1, None, "self")
    codes = family_codes(args.family, s, args.seed)[None]
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(s, 1, h, d, generator=g) for _ in range(3))
    inputs = {}
    for method in METHODS:
        cpm = context_parallel_mask(codes, args.context_parallel_size, rank, method,
                                    args.context_parallel_block, group, "cpu",
                                    args.context_parallel_block_overhead)
        kf, vf = (_PendingGather(x[cpm.local], cpm.counts, cpm.order, group).wait()
                  for x in (k, v))
        inputs[method] = (cpm, q[cpm.local].clone().requires_grad_(),
                          kf.requires_grad_(), vf.requires_grad_())
    # Ranks take turns (the others wait in a barrier), methods interleaved per round: on a
    # machine with fewer cores than ranks, each timing then has a core to itself, and a
    # drift in background load hits every method alike.
    times = {m: [] for m in METHODS}
    for _ in range(args.iters + 1):
        for method in METHODS:
            cpm, ql, kf, vf = inputs[method]
            for turn in range(args.context_parallel_size):
                torch.distributed.barrier()
                if turn == rank:
                    t0 = _clock()
                    attn._runs(ql, kf, vf, cpm, 1).sum().backward()
                    times[method].append(_clock() - t0)
            torch.distributed.barrier()
    lines = [f"{m} {len(inputs[m][0].local)} {statistics.median(times[m][1:]) * 1e3:.2f}"
             for m in METHODS]
    Path(out_dir, f"{rank}.txt").write_text("\n".join(lines))
    torch.distributed.destroy_process_group()


def _attention(args, port):
    """``ContextParallelAttention`` in a one-rank gloo group (its init asks for TP size)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                      WORLD_SIZE="1")
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    import torch
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_mm.models.cp_attention import ContextParallelAttention

    torch.distributed.init_process_group("gloo")
    parallel_state.initialize_model_parallel(1, 1)
    h, d = args.heads, args.head_dim
    config = TransformerConfig(num_layers=1, hidden_size=h * d, num_attention_heads=h,
                               kv_channels=d, attention_dropout=0.0)
    return ContextParallelAttention(config, 1, None, "self")


def calibrate(args, port) -> dict:
    """Time one query block against n causal key tiles for each n of
    ``--calibrate-tiles``; fit ms = a * n + b; the overhead is b / a tiles."""
    import numpy as np
    import torch

    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.models.context_parallel import ContextParallelMask
    from megatron_mm.reproductions.mask_families import family_codes

    attn = _attention(args, port)
    torch.set_num_threads(1)
    h, d, blk = args.heads, args.head_dim, args.context_parallel_block
    g = torch.Generator().manual_seed(1)
    # K/V keep the whole --seq-length: part of a block's fixed cost grows with it (the
    # backward of each block's key slice writes a gradient of the whole sequence).
    s = max(args.seq_length, max(args.calibrate_tiles) * blk)
    codes = torch.from_numpy(family_codes("causal", s))[None]
    k, v = (torch.randn(s, 1, h, d, generator=g).requires_grad_() for _ in range(2))
    ms = []
    for n in args.calibrate_tiles:
        # Query block n - 1 attends causal key tiles 0 .. n - 1.
        cpm = ContextParallelMask(
            codes=codes, local=torch.arange((n - 1) * blk, n * blk), order=torch.arange(s),
            counts=[s], runs=[(0, blk, 0, n * blk)], replicated=True, cp_rank=0, group=None)
        q = torch.randn(blk, 1, h, d, generator=g).requires_grad_()
        times = []
        for _ in range(args.iters + 1):
            t0 = _clock()
            attn._runs(q, k, v, cpm, 1).sum().backward()
            times.append(_clock() - t0)
        ms.append(min(times[1:]) * 1e3)  # background load only adds: the minimum is steadiest
    a, b = np.polyfit(np.asarray(args.calibrate_tiles, float), np.asarray(ms), 1)
    torch.distributed.destroy_process_group()
    return {"seq_length": s, "tiles": list(args.calibrate_tiles), "ms": ms, "ms_per_tile": float(a),
            "ms_per_block": float(b), "overhead_tiles": float(b / a)}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch.multiprocessing as mp

    from megatron_mm.plan.context_parallel.cp_assignment import BLOCK_OVERHEAD, assign_tokens
    from megatron_mm.reproductions.mask_families import family_codes

    if args.context_parallel_block_overhead is None:
        args.context_parallel_block_overhead = BLOCK_OVERHEAD

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    if args.calibrate:
        fit = calibrate(args, port)
        print(f"S={fit['seq_length']}, block {args.context_parallel_block}, {args.heads} heads of "
              f"{args.head_dim}: "
              "forward + backward ms of one query block per causal key tiles (min of "
              f"{args.iters})")
        print("  ".join(f"{n}: {m:.2f}" for n, m in zip(fit["tiles"], fit["ms"])))
        print(f"fit: {fit['ms_per_tile']:.4f} ms per tile + {fit['ms_per_block']:.4f} ms "
              f"per block -> block overhead {fit['overhead_tiles']:.1f} tiles "
              f"(--context-parallel-block-overhead; default {BLOCK_OVERHEAD})")
        return 0
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_worker, args=(args, port, out), nprocs=args.context_parallel_size,
                           start_method="spawn", join=True)
        per_rank = [dict((ln.split()[0], ln.split()[1:]) for ln in
                         Path(out, f"{r}.txt").read_text().splitlines())
                    for r in range(args.context_parallel_size)]
    codes = family_codes(args.family, args.seq_length, args.seed)
    print(f"{args.family}, S={args.seq_length}, {args.context_parallel_size} ranks, block "
          f"{args.context_parallel_block}, block overhead "
          f"{args.context_parallel_block_overhead:g} tiles: per rank planned tiles / tokens "
          f"/ measured ms (attention forward + backward, median of {args.iters}); max/mean "
          "of planned tiles, planned time (tiles + overhead per block), measured")
    for method in METHODS:
        plan = assign_tokens(codes, args.context_parallel_size, method,
                             block=args.context_parallel_block,
                             block_overhead=args.context_parallel_block_overhead)
        ms = [float(p[method][1]) for p in per_rank]
        cells = "  ".join(f"{int(t):>5}/{p[method][0]:>5}/{m:>7.1f}"
                          for t, p, m in zip(plan.attention, per_rank, ms))
        print(f"{method:<11} {cells}   tiles {plan.imbalance('attention'):.3f}"
              f"  time {plan.imbalance('cost'):.3f}"
              f"  measured {max(ms) / (sum(ms) / len(ms)):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
