"""Uniform vs frozen-aware pipeline partition, measured on this machine (PP=2, gloo).

    python tools/bench_pipeline.py [--iters 4] [--rounds 2]

A frozen ViT, a trainable projector and a frozen LLM (Cornstarch's setting). Steps:

1. ``tools/profile_layers.py`` measures every layer's forward and backward time in one
   process;
2. two-rank runs train with ``--pipeline-partition uniform`` (Megatron-Core: the encoder
   and projector on stage 0, LLM layers split evenly) and ``auto`` (frozen-aware min-max
   on the measured profile), alternating, ``--rounds`` times;
3. per stage it prints the measured busy time per iteration (Megatron-Core's
   ``forward-compute`` + ``backward-compute`` timers), max/mean, the cost model's
   prediction from the profile and its error, and the iteration-time ratio.

Every process runs one thread pinned to its own core; micro-batches are loaded before
timing so the stages' busy time is model work. Times are medians over iterations and
rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODEL = [
    "--num-layers", "8", "--hidden-size", "256", "--ffn-hidden-size", "1024",
    "--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "4",
    "--seq-length", "160", "--vision-hidden-size", "256", "--vision-num-layers", "16",
    "--vision-num-attention-heads", "8", "--img-h", "32", "--img-w", "32",
    "--patch-dim", "4", "--disable-vision-class-token",
    "--freeze-ViT", "--freeze-LM", "--micro-batch-size", "4", "--global-batch-size", "32",
    "--lr", "1e-4", "--skip-final-eval",
]
POLICIES = ("uniform", "auto")



def _clock() -> float:
    """``perf_counter`` after the device's queued work (CUDA kernels return before they
    run, so an unsynchronised clock measures their launches)."""
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.runtime.timer import device_clock
    from megatron_mm.training.assembly.initialize import device

    return device_clock(device())

def worker(argv: Sequence[str], out: str, iters: int, warmup: int) -> None:
    """One rank of a timed PP run (under torchrun)."""
    import torch

    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.assembly.initialize import shutdown_distributed
    from megatron_mm.training.assembly.data_setup import batch_iterator
    from megatron_mm.training.pretrain import setup_training
    from megatron_mm.training.config.run_config import RunConfig
    from megatron_mm.training.loop.step import train_step
    # after megatron_mm.training: it patches megatron-core's CUDA-only calls on CPU
    from megatron.core import parallel_state
    from megatron.core.timers import Timers

    torch.set_num_threads(1)
    # each rank on its own core: a stage waiting for its neighbour is idle, not sharing
    os.sched_setaffinity(0, {int(os.environ["LOCAL_RANK"]) % os.cpu_count()})
    args = parse_args(argv)
    run = setup_training(RunConfig.from_flags(args))
    source = batch_iterator(run.config, run.train_ds, run.tokenizer, 0, shuffle=True)
    batches = [next(source) for _ in range(args.num_microbatches)]
    config = run.model[0].config
    config.timers = timers = Timers(log_level=2, log_option="all")
    busy, walls = [], []
    for it in range(warmup + iters):
        torch.distributed.barrier()
        start = _clock()
        train_step(run.config, run.model_chunks, run.optimizer, run.scheduler, iter(batches),
                   run.executor, run.attention)
        torch.distributed.barrier()
        wall = _clock() - start
        compute = sum(timers(name).elapsed(reset=True)
                      for name in ("forward-compute", "backward-compute"))
        if it >= warmup:
            busy.append(compute)
            walls.append(wall)
    rank = parallel_state.get_pipeline_model_parallel_rank()
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, {"stage": rank, "busy": busy, "wall": walls})
    if torch.distributed.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    shutdown_distributed()


def run_policy(policy: str, profile: str, workdir: str, iters: int, warmup: int) -> dict:
    out = os.path.join(workdir, f"{policy}.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", _free_port(), os.path.abspath(__file__), "--worker", "--out", out,
           "--iters", str(iters), "--warmup", str(warmup), "--",
           *MODEL, "--pipeline-model-parallel-size", "2", "--pipeline-partition", policy,
           "--pipeline-profile", profile]
    _run(cmd)
    with open(out) as f:
        ranks = json.load(f)
    stages = sorted(ranks, key=lambda r: r["stage"])
    return {"busy": [statistics.median(r["busy"]) for r in stages],
            "wall": statistics.median(stages[0]["wall"]), "walls": stages[0]["wall"],
            "busy_all": [r["busy"] for r in stages]}


def predicted(policy: str, profile_path: str):
    """Stage busy seconds per iteration from the measured per-layer profile."""
    from megatron_mm.data import build_tokenizer
    from megatron_mm.plan import estimate, partition
    from megatron_mm.plan.pipeline.profile import MEASURED, LayerProfile, apply_profile
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.planning.chain import training_chain
    from megatron_mm.training.config.run_config import RunConfig

    args = parse_args(MODEL + ["--pipeline-model-parallel-size", "2"], world_size=2)
    args.model_config.language.vocab_size = build_tokenizer(
        args.tokenizer_type, args.tokenizer_model).vocab_size
    chain = apply_profile(training_chain(RunConfig.from_flags(args)),
                          LayerProfile.load(profile_path))
    part = partition(chain, 2, 1, policy)
    est = estimate(chain, part, args.num_microbatches, MEASURED)
    return part, [t * args.num_microbatches for t in est.stage_time_s], est.iteration_s


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=4, help="timed iterations per run")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2, help="uniform/auto pairs, alternating")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    if args.worker:
        worker([a for a in rest if a != "--"], args.out, args.iters, args.warmup)
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as workdir:
        profile = os.path.join(workdir, "profile.json")
        _run([sys.executable, os.path.join(ROOT, "tools", "profile_layers.py"), *MODEL,
              "--profile-out", profile, "--profile-micro-batches", "6"])
        results = {p: [] for p in POLICIES}
        for _ in range(args.rounds):
            for policy in POLICIES:
                results[policy].append(run_policy(policy, profile, workdir, args.iters,
                                                  args.warmup))
        report(results, profile)
    return 0


def report(results: dict, profile: str) -> None:
    print("PP=2, frozen ViT (16 layers) + trainable projector + frozen LLM (8 layers), "
          "8 micro-batches of 4 per iteration, 1 thread per rank, one core each; "
          "busy = Megatron-Core's "
          "forward-compute + backward-compute per iteration")
    print("| partition | layers per stage | stage 0 busy s | stage 1 busy s | max/mean | "
          "predicted stage 0 / 1 s | prediction error 0 / 1 | iteration s | "
          "predicted iteration s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    iteration = {}
    for policy in POLICIES:
        runs = results[policy]
        busy = [statistics.median(b for r in runs for b in r["busy_all"][s]) for s in (0, 1)]
        iteration[policy] = statistics.median(w for r in runs for w in r["walls"])
        part, pred, pred_iteration = predicted(policy, profile)
        err = [(p - b) / b for p, b in zip(pred, busy)]
        print(f"| {policy} | {','.join(map(str, part.layers_per_chunk))} | {busy[0]:.3f} | "
              f"{busy[1]:.3f} | {max(busy) / statistics.mean(busy):.3f} | "
              f"{pred[0]:.3f} / {pred[1]:.3f} | {err[0]:+.1%} / {err[1]:+.1%} | "
              f"{iteration[policy]:.3f} | {pred_iteration:.3f} |")
    print(f"iteration time uniform / frozen-aware: "
          f"{iteration['uniform'] / iteration['auto']:.3f}x")


def _run(cmd: List[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
        raise SystemExit(f"failed: {' '.join(cmd[:6])} ... (exit {proc.returncode})")


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
