"""Measured CP attention time per rank against the planned balance (gloo, this machine).

    python tools/bench_cp_attention.py [--family encoder_embedded] [--seq-length 4096]
    python tools/bench_cp_attention.py --calibrate   # the per-block fixed cost
    python tools/bench_cp_attention.py --memory      # one rank's forward: dense / einsum / flex
    python tools/bench_cp_attention.py --flash-speed --heads 16 --head-dim 128   # CUDA

Four ranks (one thread each) run ``ContextParallelAttention`` on one mask of ``--family``
for each token assignment (contiguous, zigzag, LPT, ours). K and V are all-gathered once
outside the timed region; each rank then times its own attention work, forward and
backward over its query runs (what the plan's tiles count), median over ``--iters``, the
ranks taking turns so that each timing has a core to itself. Prints per rank the planned
tiles, tokens and measured milliseconds, and max/mean of planned tiles, of the planned
attention time (tiles + ``--context-parallel-block-overhead`` per block) and of measured.

``--memory`` compares the kernels of one CP rank's attention instead, forward only (the
only direction FlexAttention runs on CPU): the busiest rank of ``--context-parallel-size``
(``ours``) runs its queries against the whole sequence's K/V (as the all-gather leaves
them) on ``--family``, at each of ``--memory-lengths`` tokens, by three paths: ``dense``
(one einsum against every key under a dense [S_local, S] mask, as Megatron-Core's
attention does with a dense mask), ``einsum`` (``ContextParallelAttention``: query blocks
against their key intervals) and ``flex`` (``FlexAttention``: a block mask from the codes).
Each row runs in a fresh process (forked from one preloaded server, ``local_ranks.py``);
its peak memory is the resident-set high-water mark of the one measured call above the
resident set just before it (Linux: writing 5 to /proc/self/clear_refs resets ``VmHWM``,
which /proc/self/status then reports), with
glibc's mmap threshold fixed (``MALLOC_MMAP_THRESHOLD_``) so that buffers freed before the
call return to the system instead of being reused unseen, and after an untimed first call
(FlexAttention compiles there). It counts everything the call touches (torch's
allocations, the compiled kernel's scratch), which a tracer of Python or of torch's
allocator alone would miss. Time: median of ``--iters`` calls after it. A dense row whose
scores would exceed ``--max-dense-gib`` is not run (its estimate is printed). The
training forward of the einsum path keeps its probabilities for backward on top (S_local
x S per layer); not measured here. Ends with the FlexAttention / einsum peak memory
ratio at the longest length.

``--flash-speed`` (CUDA only) times FlexAttention against flash: forward + backward in
bf16 of one sequence of each ``--memory-lengths`` (``--heads`` of ``--head-dim``), our
block mask from the codes on a causal mask against torch's
``scaled_dot_product_attention(is_causal=True)`` on the flash backend, and on
``--family``'s mask (which flash cannot take); median of ``--iters`` after a compiling
call. FlexAttention close to flash speed is the ratio near 1 (docs/gpu.md).

``--calibrate`` measures that overhead instead (one process, no ranks): forward + backward
of one query block against 1, 2, 3, ... causal key tiles of a ``--seq-length`` sequence
(minimum over ``--iters``), a least-squares fit of
ms = a * tiles + b, and b / a, the fixed cost of a block in tiles (the default of
``--context-parallel-block-overhead``, ``plan.cp_assignment.BLOCK_OVERHEAD``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
from local_ranks import run_ranks  # noqa: E402  (tools/, the script's folder)

METHODS = ("contiguous", "zigzag", "lpt", "ours")
PATHS = ("dense", "einsum", "flex")



def _clock() -> float:
    """``perf_counter`` after the device's queued work (CUDA kernels return before they
    run, so an unsynchronised clock measures their launches)."""
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.runtime.timer import device_clock
    from megatron_mm.training.assembly.initialize import device

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
    p.add_argument("--memory", action="store_true",
                   help="one CP rank's forward by dense / einsum / flex: time and peak memory")
    p.add_argument("--memory-lengths", type=int, nargs="+", default=[8192, 16384, 32768])
    p.add_argument("--max-dense-gib", type=float, default=4.0,
                   help="--memory: dense rows whose scores need more are not run")
    p.add_argument("--flash-speed", action="store_true",
                   help="CUDA: FlexAttention against flash, forward + backward, bf16")
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
    from megatron_mm.models.cp_attention import ContextParallelAttention
    from megatron_mm.models.cp_gather import PendingGather
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
        kf, vf = (PendingGather(x[cpm.local], cpm.counts, cpm.order, group).wait()
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


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory_row(args, path: str, s: int) -> dict:
    """One path at ``s`` tokens (in its own process): ms and peak MiB of one forward of
    the busiest CP rank's attention."""
    import numpy as np
    import torch

    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.models.context_parallel import allowed, context_parallel_mask
    from megatron_mm.models.flex_attention import FlexAttention, _LastBlockMask
    from megatron_mm.plan.context_parallel.cp_assignment import assign_tokens
    from megatron_mm.reproductions.mask_families import family_codes

    torch.set_num_threads(1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    attn = _attention(args, port)
    if path == "flex":
        attn = FlexAttention(attn.config, 1, None, "self")
    h, d = args.heads, args.head_dim
    p, blk = args.context_parallel_size, args.context_parallel_block
    codes = family_codes(args.family, s, args.seed)[None]
    plan = assign_tokens(codes, p, "ours", block=blk)
    rank = int(np.argmax(plan.attention))
    cpm = context_parallel_mask(codes, p, rank, "ours", blk, None, "cpu")
    g = torch.Generator().manual_seed(1)
    q = torch.randn(len(cpm.local), 1, h, d, generator=g)
    k, v = (torch.randn(s, 1, h, d, generator=g) for _ in range(2))
    if path == "dense":
        allow = allowed(cpm.codes[:, cpm.local], cpm.local, cpm.codes, torch.arange(s))
        del allow  # measured inside the call: the mask is part of the dense path's cost

        def call():
            full = allowed(cpm.codes[:, cpm.local], cpm.local, cpm.codes, torch.arange(s))
            return attn._attend(q, k, v, full, 1)
    else:
        def call():
            _LastBlockMask.key = None  # the block mask is built in the call (once per batch)
            return attn._runs(q, k, v, cpm, 1)
    with torch.no_grad():
        call()  # untimed: FlexAttention compiles here
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = _rss_kib("VmRSS")
        call()
        peak = _rss_kib("VmHWM") - before
        times = []
        for _ in range(args.iters):
            t0 = _clock()
            call()
            times.append(_clock() - t0)
    torch.distributed.destroy_process_group()
    return {"tokens": len(cpm.local), "ms": statistics.median(times) * 1e3,
            "peak_mib": peak / 1024}


def _memory_row_rank(args, path: str, s: int, out: str) -> None:
    Path(out).write_text(json.dumps(memory_row(args, path, s)))


def memory_table(args) -> int:
    """Every (length, path) row in a fresh process; the table; the ratio line."""
    # glibc reads it when a process starts: the rows' fork server must start with it
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    print(f"{args.family}, busiest of {args.context_parallel_size} CP ranks (ours), "
          f"{args.heads} heads of {args.head_dim}, fp32, 1 thread: one forward of its "
          f"queries against every key; ms (median of {args.iters}) and peak MiB above the "
          "call's start (RSS high-water, fresh process per row)")
    print(f"{'tokens':>7} {'rank':>6}  " + "  ".join(f"{p + ' ms':>10} {p + ' MiB':>10}"
                                                    for p in PATHS))
    peaks = {}
    for s in args.memory_lengths:
        cells, tokens = [], None
        for path in PATHS:
            # The dense path's fp32 scores, masked copy and probabilities, [heads, ~S/P, S].
            gib = 3 * args.heads * (s / args.context_parallel_size) * s * 4 / 2 ** 30
            if path == "dense" and gib > args.max_dense_gib:
                cells.append(f"{'not run':>10} {f'~{gib * 1024:.0f}':>10}")
                continue
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "row.json")
                try:
                    run_ranks(_memory_row_rank, 1, args, path, s, out)
                except RuntimeError as e:
                    raise SystemExit(f"{path} at {s} tokens failed:\n{str(e)[-3000:]}")
                row = json.loads(Path(out).read_text())
            tokens, peaks[(s, path)] = row["tokens"], row["peak_mib"]
            cells.append(f"{row['ms']:>10.1f} {row['peak_mib']:>10.2f}")
        print(f"{s:>7} {tokens:>6}  " + "  ".join(cells))
    s = max(args.memory_lengths)
    if peaks[(s, "einsum")] <= 0:  # below a page of resident memory: no ratio to print
        raise SystemExit(f"the einsum row at {s} tokens raised the resident set by less than "
                         "a page: measure longer sequences (--memory-lengths) or more heads")
    print(f"FlexAttention / einsum CP attention peak memory at {s} tokens: "
          f"{peaks[(s, 'flex')] / peaks[(s, 'einsum')]:.3f}")
    return 0


def flash_speed(args) -> int:
    """FlexAttention (block mask from the codes) against flash, forward + backward."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.models.flex_attention import _compiled, block_mask
    from megatron_mm.reproductions.mask_families import family_codes

    if not torch.cuda.is_available():
        raise SystemExit("--flash-speed needs a CUDA device (FlexAttention's GPU kernel)")

    def timed(fn, q, k, v):
        times = []
        for _ in range(args.iters + 1):  # the first call compiles
            for x in (q, k, v):
                x.grad = None
            torch.cuda.synchronize()
            t0 = _clock()
            fn(q, k, v).sum().backward()
            times.append(_clock() - t0)
        return statistics.median(times[1:]) * 1e3

    print(f"bf16, {args.heads} heads of {args.head_dim}, forward + backward ms (median of "
          f"{args.iters}): flash (causal), FlexAttention (causal), FlexAttention "
          f"({args.family})")
    for s in args.memory_lengths:
        q, k, v = (torch.randn(1, args.heads, s, args.head_dim, device="cuda",
                               dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        causal = torch.zeros(1, s, dtype=torch.int64, device="cuda")
        family = torch.from_numpy(family_codes(args.family, s, args.seed))[None].cuda()
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            flash = timed(lambda a, b, c: F.scaled_dot_product_attention(a, b, c,
                                                                         is_causal=True),
                          q, k, v)
        flex = {}
        for name, codes in (("causal", causal), (args.family, family)):
            mask = block_mask(codes)
            flex[name] = timed(lambda a, b, c: _compiled(a, b, c, block_mask=mask), q, k, v)
        print(f"{s:>7}  flash {flash:8.2f}  flex {flex['causal']:8.2f}  "
              f"flex/flash {flex['causal'] / flash:.2f}  flex {args.family} "
              f"{flex[args.family]:8.2f}")
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.flash_speed:
        return flash_speed(args)
    if args.memory:
        return memory_table(args)
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
