"""Measured CP attention time per rank against the planned balance (gloo, this machine).

    python tools/bench_cp_attention.py [--family encoder_embedded] [--seq-length 4096]

Four ranks (one thread each) run ``ContextParallelAttention`` on one mask of ``--family``
for each token assignment (contiguous, zigzag, LPT, ours). K and V are all-gathered once
outside the timed region; each rank then times its own attention work, forward and
backward over its query runs (what the plan's tiles count), median over ``--iters``, the
ranks taking turns so that each timing has a core to itself. Prints per rank the planned
tiles, tokens and measured milliseconds, and max/mean of planned and measured.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

METHODS = ("contiguous", "zigzag", "lpt", "ours")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="encoder_embedded",
                   choices=["causal", "prefix_lm", "encoder_embedded", "packed"])
    p.add_argument("--seq-length", type=int, default=4096)
    p.add_argument("--context-parallel-size", type=int, default=4)
    p.add_argument("--context-parallel-block", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    return p


def _worker(rank, args, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(args.context_parallel_size))
    import megatron_mm.models  # noqa: F401  (CPU patches first)
    import torch
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_mm.models.context_parallel import context_parallel_mask
    from megatron_mm.models.cp_attention import ContextParallelAttention, _GatherSequence
    from megatron_mm.plan.mask_families import family_codes

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
                                    args.context_parallel_block, group, "cpu")
        kf = _GatherSequence.apply(k[cpm.local], cpm.counts, cpm.order, group)
        vf = _GatherSequence.apply(v[cpm.local], cpm.counts, cpm.order, group)
        inputs[method] = (cpm, q[cpm.local].clone().requires_grad_(),
                          kf.detach().requires_grad_(), vf.detach().requires_grad_())
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
                    t0 = time.perf_counter()
                    attn._runs(ql, kf, vf, cpm, 1).sum().backward()
                    times[method].append(time.perf_counter() - t0)
            torch.distributed.barrier()
    lines = [f"{m} {len(inputs[m][0].local)} {statistics.median(times[m][1:]) * 1e3:.2f}"
             for m in METHODS]
    Path(out_dir, f"{rank}.txt").write_text("\n".join(lines))
    torch.distributed.destroy_process_group()


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch.multiprocessing as mp

    from megatron_mm.plan.cp_assignment import assign_tokens
    from megatron_mm.plan.mask_families import family_codes

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_worker, args=(args, port, out), nprocs=args.context_parallel_size,
                           start_method="spawn", join=True)
        per_rank = [dict((ln.split()[0], ln.split()[1:]) for ln in
                         Path(out, f"{r}.txt").read_text().splitlines())
                    for r in range(args.context_parallel_size)]
    codes = family_codes(args.family, args.seq_length, args.seed)
    print(f"{args.family}, S={args.seq_length}, {args.context_parallel_size} ranks, block "
          f"{args.context_parallel_block}: per rank planned tiles / tokens / measured ms "
          f"(attention forward + backward, median of {args.iters})")
    for method in METHODS:
        plan = assign_tokens(codes, args.context_parallel_size, method,
                             block=args.context_parallel_block)
        ms = [float(p[method][1]) for p in per_rank]
        cells = "  ".join(f"{int(t):>5}/{p[method][0]:>5}/{m:>7.1f}"
                          for t, p, m in zip(plan.attention, per_rank, ms))
        print(f"{method:<11} {cells}   planned max/mean {plan.imbalance('attention'):.3f}"
              f"  measured max/mean {max(ms) / (sum(ms) / len(ms)):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
