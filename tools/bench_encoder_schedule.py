"""Encoder placements measured on this machine (2 ranks, gloo): in the pipeline, in its
bubbles, on a rank of their own.

    python tools/bench_encoder_schedule.py [--workload heavy|light] [--iters 4]
                                           [--rounds 2] [--png-out t.png] [--audio] [--moe]
                                           [--schedules megatron ...]
                                           [training flags overriding the model's]

An encoder-heavy model (a trainable 12-layer ViT in front of a 4-layer LLM, one 32x32
image of 64 patches per sample, 8 micro-batches of 4; ``--audio`` adds a trainable 6-layer
Whisper-style audio encoder and trains on spoken digits, which needs espeak-ng; ``--moe``
makes the LLM a small mixture of experts: layer 0 dense, layers 1-3 eight experts of 256,
top-2, the load-balancing loss on, the all-to-all dispatcher; two cores give no room for
expert parallelism, so EP is 1), two ranks, each one process with one thread pinned to its
own core (a bubble is real idle time). ``--workload`` changes the model:

- ``heavy``: images of 64x64 pixels (256 patches each, the LLM's sequence 352 tokens), the
  ViT trains: its work per micro-batch about twice the LLM's. A sample this large leaves
  room for few per iteration: 4 micro-batches of 2;
- ``light``: a 2-layer ViT (the encoder about a third of the LLM's work).

Steps:

1. ``tools/profile_layers.py`` measures every layer's forward and backward time, once on
   each core at the same time (the runs keep both cores busy), averaged;
2. two-rank runs train with Megatron-Core's own 1F1B schedule, the encoder on stage 0
   (``--encoder-schedule megatron``, ``--pipeline-partition uniform``), the same schedule
   on the frozen-aware balanced layout (``megatron-auto``: ``--pipeline-partition auto``)
   and interleaved over two virtual stages per rank on it (``megatron-auto-vpp2``: the
   strongest baseline without the encoder schedules), and with the encoder as its own
   pipeline over both ranks (``coarse``, ``bubble`` with ``--pipeline-partition auto``:
   LLM chunks and encoder pieces balanced per rank on the measured profile, the bubble
   schedule generated on it; ``bubble-vpp2`` with the LLM interleaved, ``bubble-evpp2``
   with the encoder interleaved over its two stages, two rounds), with the encoder
   on a rank of its own and the whole LLM on the other (``separate``:
   ``--encoder-schedule separate``, LLM PP=1), and with ``--encoder-schedule auto`` (the
   planner's pick on the profile, read from the run's log), alternating, ``--rounds``
   times;
3. it prints the median iteration time of each (and its forward-backward part: the
   schedule and gradient sync, without the optimizer step), its ratio to Megatron-Core's,
   and the simulator's prediction from the profile plus the p2p, gradient-sync and
   optimizer-step times measured before the timed iterations (``plan.simulate`` on the
   run's own plan and program: separate's with the encoder rank's and the LLM rank's
   timelines), and writes the measured timelines (the executor records them) beside the
   simulated ones as a PNG and a Chrome trace (separate's rows by the program's ranks:
   rank 0 the LLM, rank 1 the encoder). The last lines: auto over the fastest fixed
   placement, the best encoder placement (coarse, bubble, separate) over the fastest
   Megatron-Core row (the fastest rows by their medians; each ratio the median over the
   rounds of that round's ratio, so the machine's drift over the run cancels), and the
   simulator's error on every row.

Where each should win on 2 ranks. E and L are the encoder's and the LLM's forward and
backward time per micro-batch, M the micro-batches. ``separate`` is a two-stage pipeline
cut at the encoder's output: at least M x max(E, L), against about M (E + L) / 2 plus the
bubble for a balanced PP=2, so it can only tie, where E = L, and loses by about
2 max(E, L) / (E + L) elsewhere (heavy about 4/3, light about 3/2); what it buys (the
encoder's own data-parallel size and TP, no encoder work in the LLM's stages) pays at
cluster scale, not here. ``bubble`` can only take idle time away: the 1F1B bubble of about
1 / (M + 1) of the balanced layout (less what interleaving already removes) and the
imbalance that whole-layer cuts leave; a trainable encoder keeps the first micro-batch's
encoder forward before any LLM work and the last one's encoder backward after it. So on
light (four coarse LLM layers, a small encoder to fill the difference) it should beat
every Megatron-Core row; on heavy (twelve fine ViT layers that balance Megatron-Core's
layout well) it should beat 1F1B by about the bubble and interleaving by a few percent.

Micro-batches are loaded before timing, so iteration time is model work plus waiting.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from typing import List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))
from local_ranks import run_ranks, run_scripts  # noqa: E402

MODEL = [
    "--num-layers", "4", "--hidden-size", "256", "--ffn-hidden-size", "1024",
    "--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "4",
    "--seq-length", "160", "--vision-hidden-size", "256", "--vision-num-layers", "12",
    "--vision-num-attention-heads", "8", "--img-h", "32", "--img-w", "32",
    "--patch-dim", "4", "--disable-vision-class-token",
    "--micro-batch-size", "4", "--global-batch-size", "32", "--lr", "1e-4",
    "--skip-final-eval",
]
# --workload: the model above (none given: docs/encoder_schedules.md's figures) with
# (module docstring)
WORKLOADS = {
    "heavy": ["--img-h", "64", "--img-w", "64", "--seq-length", "352",
              "--micro-batch-size", "2", "--global-batch-size", "8"],
    "light": ["--vision-num-layers", "2"],
}
MOE = ["--num-experts", "8", "--moe-ffn-hidden-size", "256", "--moe-router-topk", "2",
       "--moe-layer-freq", "[0,1,1,1]", "--moe-aux-loss-coeff", "0.01",
       "--moe-token-dispatcher-type", "alltoall"]
AUDIO = ["--audio-model-type", "whisper", "--audio-hidden-size", "256",
         "--audio-num-layers", "6", "--audio-num-attention-heads", "8",
         "--audio-num-mel-bins", "80", "--audio-max-source-positions", "64",
         "--audio-pool-stride", "4"]
# Rows: Megatron-Core's 1F1B on its own layout (``megatron``), on the frozen-aware
# balanced layout (``megatron-auto``), and interleaved over two virtual stages per rank on
# the balanced layout (``megatron-auto-vpp2``: the strongest baseline a user can set up
# without the encoder schedules); then the encoder as its own pipeline (each rank's LLM and
# encoder work balanced on the measured profile), the bubble schedule also with the LLM
# interleaved; the encoder on a rank of its own and the LLM whole on the other
# (``separate``: LLM PP=1); and ``--encoder-schedule auto`` (the planner's pick).
# ``bubble-evpp2``: the encoder interleaved over its stages, two rounds
# (--encoder-virtual-pipeline-model-parallel-size 2; left out for an encoder of fewer than
# 4 layers).
SCHEDULES = ("megatron", "megatron-auto", "megatron-auto-vpp2", "coarse", "bubble",
             "bubble-vpp2", "bubble-evpp2", "separate", "auto")
ENCODER_SCHEDULE = {"megatron": "megatron", "megatron-auto": "megatron",
                    "megatron-auto-vpp2": "megatron", "coarse": "coarse", "bubble": "bubble",
                    "bubble-vpp2": "bubble", "bubble-evpp2": "bubble", "separate": "separate",
                    "auto": "auto"}
PARTITION = {"megatron": "uniform", "megatron-auto": "auto", "megatron-auto-vpp2": "auto",
             "coarse": "auto", "bubble": "auto", "bubble-vpp2": "auto", "bubble-evpp2": "auto",
             "separate": "auto", "auto": "auto"}
VPP = {"megatron-auto-vpp2": 2, "bubble-vpp2": 2}
ENCODER_VPP = {"bubble-evpp2": 2}
COMPUTE = ("F", "B", "EF", "EB")  # a timeline's compute actions (the rest: transfers)
PP = {"separate": 1}  # the rest: 2 (the world's two ranks; separate: 1 encoder rank + 1)


def schedule_flags(schedule: str) -> List[str]:
    """The flags of a row, beside the model's."""
    vpp, evpp = VPP.get(schedule), ENCODER_VPP.get(schedule)
    return ["--pipeline-model-parallel-size", str(PP.get(schedule, 2)), "--encoder-schedule",
            ENCODER_SCHEDULE[schedule], "--pipeline-partition", PARTITION[schedule]] + (
        ["--virtual-pipeline-model-parallel-size", str(vpp)] if vpp else []) + (
        ["--encoder-virtual-pipeline-model-parallel-size", str(evpp)] if evpp else [])



def _clock() -> float:
    """``perf_counter`` after the device's queued work (CUDA kernels return before they
    run, so an unsynchronised clock measures their launches)."""
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.runtime.timer import device_clock
    from megatron_mm.training.assembly.initialize import device

    return device_clock(device())

def worker(argv: Sequence[str], out: str, iters: int, warmup: int) -> None:
    """One rank of a timed PP run (``run_schedule``)."""
    import torch

    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.training.loop import step
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.assembly.data_setup import batch_iterator
    from megatron_mm.training.pretrain import setup_training
    from megatron_mm.training.config.run_config import RunConfig
    from megatron_mm.training.separate.run import SeparateRun
    from megatron.core import parallel_state
    from megatron_mm.training.assembly.initialize import shutdown_distributed

    torch.set_num_threads(1)
    os.sched_setaffinity(0, {int(os.environ["LOCAL_RANK"]) % os.cpu_count()})
    args = parse_args(argv)
    run = setup_training(RunConfig.from_flags(args))
    separate = isinstance(run.executor, SeparateRun)
    # an encoder rank of the separate placement encodes every LLM replica's micro-batches
    source = batch_iterator(run.config, run.train_ds, run.tokenizer, 0, shuffle=True,
                            replicas=run.executor.replicas if separate else None)
    batches = [next(source) for _ in range(args.num_microbatches)]
    links = _communication_costs(run, args)
    executor = run.executor.executor if separate else run.executor
    walls, schedules, timeline = [], [], []
    run_schedule = step.run_schedule

    def timed_schedule(*a, **k):  # the forward-backward part of train_step
        start = _clock()
        out = run_schedule(*a, **k)
        schedules.append(_clock() - start)
        return out

    step.run_schedule = timed_schedule
    for it in range(warmup + iters):
        if executor is not None:
            executor.record_timeline = it == warmup + iters - 1
        torch.distributed.barrier()
        start = _clock()
        data = ([iter(batches) for _ in run.model_chunks] if len(run.model_chunks) > 1
                else iter(batches))  # interleaving: one iterator per model chunk
        step.train_step(run.config, run.model_chunks, run.optimizer, run.scheduler, data,
                        run.executor, run.attention)
        torch.distributed.barrier()
        walls.append(_clock() - start)
    walls, schedules = walls[warmup:], schedules[warmup:]
    if executor is not None:
        timeline = [t.to_dict() for t in executor.timeline]
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, {
        "stage": parallel_state.get_pipeline_model_parallel_rank(), "wall": walls,
        "schedule": schedules, "timeline": timeline, **links})
    if torch.distributed.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    shutdown_distributed()


def _communication_costs(run, args, repeats: int = 5) -> dict:
    """What the simulator charges beyond compute, measured here: one activation's p2p
    transfer between the two ranks (half a round trip), ``finalize_model_grads`` (the
    tied embedding's gradient all-reduce between first and last stage; under separate each
    side's own) and the optimizer step (on zero gradients, before the timed iterations:
    the same work)."""
    import torch
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron.core.distributed import finalize_model_grads

    # the world's two ranks: the pipeline's two stages, or separate's encoder and LLM rank
    group = torch.distributed.group.WORLD
    peers = [0, 1]
    me = torch.distributed.get_rank()
    x = torch.zeros(args.seq_length, args.micro_batch_size, args.hidden_size)
    trips, syncs, steps = [], [], []
    for _ in range(repeats):
        torch.distributed.barrier()
        start = _clock()
        if me == 0:
            torch.distributed.send(x, peers[1], group=group)
            torch.distributed.recv(x, peers[1], group=group)
        else:
            torch.distributed.recv(x, peers[0], group=group)
            torch.distributed.send(x, peers[0], group=group)
        trips.append(_clock() - start)
        torch.distributed.barrier()
        start = _clock()
        finalize_model_grads(run.model_chunks, torch.tensor(1, dtype=torch.int))
        syncs.append(_clock() - start)
        torch.distributed.barrier()
        start = _clock()
        run.optimizer.step()
        steps.append(_clock() - start)
    for chunk in run.model_chunks:
        chunk.zero_grad_buffer()
    return {"p2p_s": statistics.median(trips) / 2, "grad_sync_s": statistics.median(syncs),
            "optimizer_s": statistics.median(steps)}


def co_run_profile(workdir: str, model: Sequence[str]) -> str:
    """Per-layer times measured as the runs use the machine: one profiling process pinned
    to each core at once (both cores busy), their times averaged."""
    from megatron_mm.plan.pipeline.profile import LayerProfile

    paths = [os.path.join(workdir, f"profile{core}.json") for core in (0, 1)]
    try:  # process r pinned to core r, forked from the rows' preloaded server
        run_scripts(os.path.join(ROOT, "tools", "profile_layers.py"),
                    [[*model, "--profile-out", path, "--profile-micro-batches", "6"]
                     for path in paths], pin=True)
    except RuntimeError as e:
        raise SystemExit(f"profile_layers.py failed:\n{str(e)[-3000:]}")
    first, second = (LayerProfile.load(p) for p in paths)
    for a, b in zip(first.layers, second.layers):
        a.forward_s = (a.forward_s + b.forward_s) / 2
        a.backward_s = (a.backward_s + b.backward_s) / 2
    path = os.path.join(workdir, "profile.json")
    first.save(path)
    return path


def run_schedule(schedule: str, profile: str, workdir: str, iters: int, warmup: int,
                 model: Sequence[str]) -> dict:
    out = os.path.join(workdir, f"{schedule}.json")
    argv = [*model, *schedule_flags(schedule), "--pipeline-profile", profile]
    try:  # 2 ranks forked from one preloaded server (local_ranks)
        log = "".join(run_ranks(worker, 2, argv, out, iters, warmup))
    except RuntimeError as e:
        raise SystemExit(f"{schedule} failed:\n{str(e)[-8000:]}")
    with open(out) as f:
        ranks = json.load(f)
    chose = re.search(r"--encoder-schedule auto chose (.*?): simulated", log)
    return {"walls": ranks[0]["wall"], "schedules": ranks[0]["schedule"],
            "chose": chose.group(1) if chose else None,
            "timeline": [t for r in ranks for t in r["timeline"]],
            "p2p_s": max(r["p2p_s"] for r in ranks),
            "grad_sync_s": max(r["grad_sync_s"] for r in ranks),
            "optimizer_s": max(r["optimizer_s"] for r in ranks)}


def simulated(schedule: str, profile_path: str, p2p_s: float, grad_sync_s: float,
              model: Sequence[str], optimizer_s: float = 0.0):
    """The simulator's replay of ``schedule`` on the measured per-layer profile,
    communication costs and optimizer step: the run's own plan and program (``auto``: of
    the schedule it chose; ``separate``: the encoder rank's and the LLM rank's)."""
    from megatron_mm.data import build_tokenizer
    from megatron_mm.plan.schedules.encoder_pipeline import schedule_costs, megatron_costs
    from megatron_mm.plan.schedules.generate import megatron
    from megatron_mm.plan.pipeline.profile import MEASURED
    from megatron_mm.plan.schedules.simulate import simulate
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.planning.encoder_schedule import make_schedule
    from megatron_mm.training.planning.training_plan import plan_pipeline
    from megatron_mm.training.config.run_config import RunConfig
    from megatron_mm.training.separate.run import separate_program
    from megatron_mm.training.assembly.separate_world import separate_ranks

    args = parse_args([*model, *schedule_flags(schedule), "--pipeline-profile", profile_path],
                      world_size=2)
    args.model_config.language.vocab_size = build_tokenizer(
        args.tokenizer_type, args.tokenizer_model).vocab_size
    config = RunConfig.from_flags(args)
    plan = plan_pipeline(config, args.model_config)  # costs: the measured profile
    config = plan.schedule.applied(config)  # auto: the schedule it chose
    chain, m = plan.chain, args.num_microbatches
    pp = config.parallel.pipeline_model_parallel_size
    vpp = config.parallel.virtual_pipeline_model_parallel_size or 1
    if plan.separate is not None:
        sizes = separate_ranks(config.parallel, config.encoder_schedule, 2).sizes
        costs = schedule_costs(chain, plan.partition, plan.separate.pieces, MEASURED, p2p_s)
        order = separate_program(config, plan, sizes)(m * sizes.llm_data_parallel_size)
    elif plan.encoder_plan is None:
        costs = megatron_costs(chain, plan.partition, MEASURED, p2p_s)
        order = megatron(pp, vpp, m)
    else:
        costs = schedule_costs(chain, plan.encoder_plan.llm_partition, plan.encoder_plan.pieces,
                               MEASURED, p2p_s)
        order = make_schedule(config, plan.encoder_plan, m)
    costs.grad_sync_s, costs.optimizer_s = grad_sync_s, optimizer_s
    sim = simulate(order, costs)
    sim.schedule = f"{schedule} (simulated)"
    return sim


def measured_timeline(schedule: str, events: List[dict]):
    """The executor's recorded actions of one iteration as a ``Simulation`` record."""
    from megatron_mm.plan.schedules.simulate import Simulation, TimedAction

    timeline = [TimedAction.from_dict(e) for e in events]
    ranks = 1 + max(t.rank for t in timeline)
    end = max(t.end_s for t in timeline)
    busy = [sum(t.end_s - t.start_s for t in timeline if t.rank == r) for r in range(ranks)]
    return Simulation(schedule=f"{schedule} (measured)", iteration_s=end, busy_s=busy,
                      idle_s=[end - b for b in busy],
                      bubble_fraction=sum(end - b for b in busy) / (end * ranks),
                      timeline=timeline)


def action_ratios(measured, simulated) -> str:
    """Per action kind, the measured time of its actions over their simulated (profiled)
    time; then each rank's idle time, measured vs simulated: where an iteration's time goes
    that the profile does not predict."""
    sim = {(t.rank, t.kind, t.microbatch, t.chunk): t.end_s - t.start_s
           for t in simulated.timeline}
    kinds = {}
    for t in measured.timeline:
        key = (t.rank, t.kind, t.microbatch, t.chunk)
        if key in sim and sim[key] > 0:
            got, want = kinds.get(t.kind, (0.0, 0.0))
            kinds[t.kind] = (got + t.end_s - t.start_s, want + sim[key])
    ratios = ", ".join(f"{k} {got / want:.2f}" for k, (got, want) in sorted(kinds.items()))

    def idle(timeline):  # to the timeline's end (no gradient sync, no optimizer step)
        end = max(t.end_s for t in timeline)
        return [end - sum(t.end_s - t.start_s for t in timeline
                          if t.rank == r and t.kind in COMPUTE)
                for r in sorted({t.rank for t in timeline})]
    idles = ", ".join(f"rank {r} {m * 1e3:.0f} vs {s * 1e3:.0f} ms" for r, (m, s) in
                      enumerate(zip(idle(measured.timeline), idle(simulated.timeline))))
    return f"{ratios}; idle {idles}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=4, help="timed iterations per run")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2, help="runs of every schedule, alternating")
    p.add_argument("--png-out", default="encoder_schedule_timeline.png")
    p.add_argument("--trace-out", default=None, help="Chrome trace of the same timelines")
    p.add_argument("--audio", action="store_true",
                   help="add a 6-layer audio encoder (vision + audio, spoken digits)")
    p.add_argument("--moe", action="store_true",
                   help="the LLM a mixture of experts (dense layer 0, 8 experts top-2 after)")
    p.add_argument("--workload", choices=sorted(WORKLOADS),
                   help="heavy: a trainable ViT with four times the patches per image, few "
                        "micro-batches; light: a 2-layer ViT (module docstring)")
    p.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES),
                   help="the rows to run (default all)")
    args, rest = p.parse_known_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # training flags after the tool's own override the model's (a smaller one for a test)
    args.model = (MODEL + WORKLOADS.get(args.workload, []) + (AUDIO if args.audio else [])
                  + (MOE if args.moe else []) + rest)
    args.schedules = [s for s in SCHEDULES if s in args.schedules]
    vit_layers = _vit_layers(args.model)
    short = [s for s in args.schedules if s in ENCODER_VPP and ENCODER_VPP[s] * 2 > vit_layers]
    if short:
        print(f"left out {', '.join(short)}: the ViT's {vit_layers} layers are too few to "
              "interleave over 2 ranks")
        args.schedules = [s for s in args.schedules if s not in short]
    with tempfile.TemporaryDirectory() as workdir:
        profile = co_run_profile(workdir, args.model)
        results = {s: [] for s in args.schedules}
        for _ in range(args.rounds):
            for schedule in args.schedules:
                results[schedule].append(run_schedule(schedule, profile, workdir, args.iters,
                                                      args.warmup, args.model))
        report(results, profile, args)
    return 0


def report(results: dict, profile: str, args) -> None:
    from megatron_mm.plan.schedules.timeline import write_chrome_trace, write_png

    print(describe(args))
    print(f"| schedule | iteration s | vs {args.schedules[0]} | of which forward-backward s | "
          "simulated s | sim vs forward-backward | sim vs iteration |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    iteration, errors, sims, timelines, overheads = {}, {}, {}, [], []
    p2p = statistics.median(r["p2p_s"] for runs in results.values() for r in runs)
    sync = statistics.median(r["grad_sync_s"] for runs in results.values() for r in runs)
    step = statistics.median(r["optimizer_s"] for runs in results.values() for r in runs)
    base = args.schedules[0]  # the "vs" column's row: megatron when it runs
    for schedule in args.schedules:
        iteration[schedule] = statistics.median(w for r in results[schedule] for w in r["walls"])
        fwd_bwd = statistics.median(w for r in results[schedule] for w in r["schedules"])
        sim = simulated(schedule, profile, p2p, sync, args.model, step)
        chose = {r["chose"] for r in results[schedule]} - {None}
        name = f"{schedule} (chose {' / '.join(sorted(chose))})" if chose else schedule
        print(f"| {name} | {iteration[schedule]:.3f} | "
              f"{iteration[schedule] / iteration[base]:.3f} | {fwd_bwd:.3f} | "
              f"{sim.iteration_s:.3f} | {sim.iteration_s / fwd_bwd - 1:+.1%} | "
              f"{sim.iteration_s / iteration[schedule] - 1:+.1%} |")
        errors[schedule] = sim.iteration_s / iteration[schedule] - 1
        sims[schedule] = sim
        timelines.append(sim)
        if results[schedule][-1]["timeline"]:
            timelines.append(measured_timeline(schedule, results[schedule][-1]["timeline"]))
            overheads.append(f"{schedule}: " + action_ratios(timelines[-1], sim))
    print(f"measured and charged by the simulator besides the profile: p2p {p2p * 1e3:.2f} ms "
          f"per transfer, gradient sync {sync * 1e3:.1f} ms and optimizer step "
          f"{step * 1e3:.1f} ms per iteration (the simulated figure includes both; the "
          "forward-backward column has neither)")
    print("measured / profiled time of each kind of action (the executor's timeline of the "
          "last iteration against the simulator's costs), and idle time per rank measured vs "
          "simulated:")
    for line in overheads:
        print(f"  {line}")
    mcore = [s for s in iteration if ENCODER_SCHEDULE[s] == "megatron"]
    bubbles = [s for s in iteration if s.startswith("bubble")]
    for other in ("megatron", "megatron-auto"):
        if "bubble" in iteration and other in iteration:
            print(f"bubble / {other} iteration time: "
                  f"{paired(results, 'bubble', other):.3f}")
    if mcore and bubbles:
        strongest, ours = min(mcore, key=iteration.get), min(bubbles, key=iteration.get)
        print(f"{ours} / {strongest} (the fastest of each) iteration time: "
              f"{paired(results, ours, strongest):.3f}")
    write_png(timelines, args.png_out, unit="s")
    print(f"wrote {args.png_out}")
    if args.trace_out:
        write_chrome_trace(timelines, args.trace_out)
        print(f"wrote {args.trace_out}")
    for line in ratios(iteration, errors, results, sims, step):
        print(line)


def ratios(iteration: dict, errors: dict, results: dict, sims: dict,
           optimizer_s: float) -> List[str]:
    """The last lines: the planner's pick against the fixed placements, the encoder
    schedules' best against Megatron-Core's and how far below it any placement of the same
    work on these ranks could go, the simulator against every row. The rows compared are
    the fastest by their medians; their ratio is ``paired``."""
    lines = []
    fixed = [s for s in iteration if s != "auto"]
    if "auto" in iteration and fixed:
        fastest = min(fixed, key=iteration.get)
        chose = " / ".join(sorted({r["chose"] or "?" for r in results["auto"]}))
        lines.append(f"auto (chose {chose}) / fastest fixed placement ({fastest}) iteration "
                     f"time: {paired(results, 'auto', fastest):.3f}")
    mcore = [s for s in fixed if ENCODER_SCHEDULE[s] == "megatron"]
    placements = [s for s in fixed if ENCODER_SCHEDULE[s] != "megatron"]
    if mcore and placements:
        strongest, best = min(mcore, key=iteration.get), min(placements, key=iteration.get)
        lines.append(f"best placement ({best}) / fastest Megatron-Core row ({strongest}) "
                     f"iteration time: {paired(results, best, strongest):.3f}")
        # Every placement runs the same forward and backward work: no rank idle, it ends
        # after its even share of it, then the optimizer step
        sim = sims[strongest]
        work = sum(t.end_s - t.start_s for t in sim.timeline if t.kind in COMPUTE)
        bound = work / len(sim.busy_s) + optimizer_s
        lines.append(f"no-idle bound ({strongest}'s simulated forward-backward work split "
                     f"evenly over its {len(sim.busy_s)} ranks, then the optimizer step) / "
                     f"its simulated iteration time: {bound / sim.iteration_s:.3f}")
    worst = max(errors, key=lambda s: abs(errors[s]))
    lines.append("simulated vs measured iteration time: " + ", ".join(
        f"{s} {e:+.1%}" for s, e in errors.items()) + f"; largest |error| {abs(errors[worst]):.1%}"
        f" ({worst})")
    return lines


def _vit_layers(model: Sequence[str]) -> int:
    """The ViT's layer count among ``model``'s flags (the last one given, as argparse takes
    it; read here because the launching process imports no Megatron-Core)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--vision-num-layers", type=int)
    return parser.parse_known_args(list(map(str, model)))[0].vision_num_layers


def paired(results: dict, a: str, b: str) -> float:
    """Row ``a``'s iteration time over row ``b``'s: the median over the rounds of each
    round's ratio of their medians. The rows alternate, so one round's runs are minutes apart
    and the machine's drift over the whole run (several percent here) cancels."""
    return statistics.median(
        statistics.median(ra["walls"]) / statistics.median(rb["walls"])
        for ra, rb in zip(results[a], results[b]))


def describe(args) -> str:
    """The run's first line: what the workload is (from its flags)."""
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.training.cli.arguments import parse_args

    a = parse_args([*args.model, *schedule_flags("megatron")], world_size=2)
    vision = a.model_config.encoders["vision"]
    patches = (a.img_h // a.patch_dim) * (a.img_w // a.patch_dim)
    frozen = "frozen" if a.freeze_ViT else "trainable"
    audio = " + audio encoder (6 layers, 64 frames x 4 clips)" if args.audio else ""
    moe = (", MoE: layer 0 dense, layers 1-3 8 experts top-2, EP 1" if args.moe else "")
    return (f"{args.workload or 'default'} workload: {frozen} ViT ({vision.num_layers} layers, "
            f"{patches} patches x {a.micro_batch_size} images){audio} + LLM "
            f"({a.num_layers} layers{moe}, {a.seq_length} tokens x {a.micro_batch_size}), "
            f"{a.num_microbatches} micro-batches per iteration; PP=2 on 2 ranks (separate: 1 "
            f"encoder rank + the LLM on 1), one thread per rank on its own core; medians of "
            f"{args.rounds} x {args.iters} iterations")


if __name__ == "__main__":
    sys.exit(main())
