"""Peak activation memory and iteration time at TP=2, with and without --sequence-parallel.

    python tools/bench_sequence_parallel.py [<training flags>] [--bench-iters 3]

Two gloo ranks (TP=2, one thread each) build and train the same model from the same seed
without, then with ``--sequence-parallel`` (default model below, or the training flags
given); per run: one warm-up iteration, ``--bench-iters`` timed ones (median), then one more under
saved-tensor hooks for the peak of live saved-for-backward bytes on each rank (each
storage once while autograd holds it, parameters left out; ``tools/bench_recompute.py``'s
counter). Sequence parallelism stores the norms', residuals' and dropouts' inputs at 1/TP
(the linears save their input shard and gather it again in backward), so the peak falls;
attention scores and the MLP's inner activations are split by TP either way. Times on CPU
say little: gloo's all-gather and reduce-scatter into tensors cost several all-reduces.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

MODEL = [
    "--num-layers", "4", "--hidden-size", "256", "--ffn-hidden-size", "512",
    "--num-attention-heads", "8", "--seq-length", "128", "--vision-model-type", "siglip",
    "--vision-hidden-size", "128", "--vision-num-layers", "4",
    "--vision-num-attention-heads", "4", "--img-h", "32", "--img-w", "32", "--patch-dim", "4",
    "--micro-batch-size", "8", "--global-batch-size", "16", "--lr", "1e-4",
    "--log-interval", "1000", "--skip-final-eval",
]


def _worker(rank: int, argv: Sequence[str], iters: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE="2", OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from bench_recompute import LiveSavedBytes
    from megatron_mm.training.loop.activation_profile import parameter_storages
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.assembly.initialize import set_random_seed
    from megatron_mm.training.assembly.data_setup import batch_iterators
    from megatron_mm.training.assembly.model_setup import (build_model_chunks,
                                                           setup_model_and_optimizer)
    from megatron_mm.training.pretrain import setup_training
    from megatron_mm.training.config.run_config import RunConfig
    from megatron_mm.training.loop.step import train_step as step

    args = parse_args(list(argv), world_size=2)
    run = setup_training(RunConfig.from_flags(args))
    results = []
    for sp in (False, True):  # the same seed, model and data order for both
        args.sequence_parallel = sp
        config = RunConfig.from_flags(args)
        set_random_seed(args.seed)
        chunks, optimizer, scheduler = setup_model_and_optimizer(
            config, build_model_chunks(config, run.tokenizer, run.model_config, run.plan,
                                       run.encoder_replicas))
        data = batch_iterators(config, run.train_ds, run.tokenizer, 0, shuffle=True)

        def train_step():
            return step(config, chunks, optimizer, scheduler, data, run.executor,
                        run.attention)

        train_step()  # warm-up
        times, loss = [], None
        for _ in range(iters):
            torch.distributed.barrier()
            start = time.perf_counter()
            loss = train_step().loss
            times.append(time.perf_counter() - start)
        tracker = LiveSavedBytes(parameter_storages(chunks))
        with torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack):
            train_step()
        results.append(dict(time=statistics.median(times), peak=tracker.peak, loss=loss))
    torch.save(results, os.path.join(out, f"{rank}.pt"))
    torch.distributed.destroy_process_group()


def measure(argv: Sequence[str], iters: int) -> list:
    """Per run (without, with SP): each rank's time, peak and loss."""
    import torch
    import torch.multiprocessing as mp
    from dist_harness import free_port

    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_worker, args=(argv, iters, free_port(), out), nprocs=2,
                           start_method="spawn", join=True)
        ranks = [torch.load(os.path.join(out, f"{r}.pt")) for r in range(2)]
    return [[ranks[r][k] for r in range(2)] for k in range(2)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    tool = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False)
    tool.add_argument("--bench-iters", type=int, default=3)
    ours, train_argv = tool.parse_known_args(argv)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    base = (train_argv or MODEL) + ["--tensor-model-parallel-size", "2"]
    rows = list(zip(("TP=2", "TP=2 --sequence-parallel"), measure(base, ours.bench_iters)))
    print(f"\nsequence parallelism benchmark: {' '.join(base)}; median of "
          f"{ours.bench_iters} iterations, 2 gloo ranks x 1 thread")
    print("| run | iteration s | peak saved-activation MiB per rank | vs TP=2 | last loss |")
    print("| --- | --- | --- | --- | --- |")
    first = max(r["peak"] for r in rows[0][1])
    for name, ranks in rows:
        peak = max(r["peak"] for r in ranks)
        print(f"| {name} | {max(r['time'] for r in ranks):.3f} | {peak / 2 ** 20:.2f} | "
              f"{peak / first:.3f} | {ranks[0]['loss']:.6f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
