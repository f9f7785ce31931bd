"""Iteration time and peak activation memory: no recompute, full, adaptive under a budget.

    python tools/bench_recompute.py <training flags> [--bench-iters 5]
        [--recompute-memory-budget GB]

One process (PP=1), one run: the model's layers are profiled first (times and the bytes
each layer saves for backward, saved-tensor hooks), then the same model is built four
times from the same seed and trained for ``--bench-iters`` timed iterations (after one
warm-up; the four take turns, one iteration each) with no recompute, full recompute
(every layer, block method), the fewest leading layers that fit the budget with the same
number in every stack ("same N"), and adaptive recompute (``--recompute-memory-budget``:
per stack, the cheapest choice that fits; without the flag, the budget halfway between
none and full, from the profile). Peak activation memory is the peak of live
saved-for-backward bytes over one more iteration after the timed ones (saved-tensor
hooks, left off while timing: each storage once while autograd holds it, parameters left
out; recomputation's transient saves count). Model state is the bytes of parameters,
main gradients and Adam state actually allocated.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from typing import Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class LiveSavedBytes:
    """Live and peak bytes of tensors autograd holds for backward."""

    def __init__(self, exclude):
        self.exclude, self.refs, self.live, self.peak = exclude, {}, 0, 0

    def pack(self, t):
        ptr = t.untyped_storage().data_ptr()
        if ptr in self.exclude:
            return t
        count, nbytes = self.refs.get(ptr, (0, t.untyped_storage().nbytes()))
        if count == 0:
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        self.refs[ptr] = (count + 1, nbytes)
        return _Held(t, ptr, self)

    @staticmethod
    def unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def release(self, ptr):
        count, nbytes = self.refs[ptr]
        if count == 1:
            del self.refs[ptr]
            self.live -= nbytes
        else:
            self.refs[ptr] = (count - 1, nbytes)


class _Held:
    def __init__(self, tensor, ptr, tracker):
        self.tensor, self.ptr, self.tracker = tensor, ptr, tracker

    def __del__(self):
        self.tracker.release(self.ptr)



def _clock() -> float:
    """``perf_counter`` after the device's queued work (CUDA kernels return before they
    run, so an unsynchronised clock measures their launches)."""
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.runtime.timer import device_clock
    from megatron_mm.training.assembly.initialize import device

    return device_clock(device())

def state_bytes(ddp_chunks, optimizer) -> int:
    import torch

    total = 0
    for chunk in ddp_chunks:
        for p in chunk.parameters():
            total += p.untyped_storage().nbytes()
            grad = getattr(p, "main_grad", None)
            total += 0 if grad is None else grad.numel() * grad.element_size()
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        for state in opt.optimizer.state.values():
            total += sum(v.numel() * v.element_size() for v in state.values()
                         if isinstance(v, torch.Tensor) and v.dim() > 0)
    return total


def main(argv: Optional[Sequence[str]] = None) -> int:
    tool = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False)
    tool.add_argument("--bench-iters", type=int, default=5)
    ours, train_argv = tool.parse_known_args(argv)

    import torch
    from megatron_mm.plan import StagePartition
    from megatron_mm.plan.costs.hardware import MemoryModel
    from megatron_mm.plan.pipeline.recompute_budget import GB, chunk_activations, static_bytes
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.training.loop.activation_profile import parameter_storages
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.assembly.initialize import set_random_seed, shutdown_distributed
    from megatron_mm.training.loop.layer_profile import profile_layers
    from megatron_mm.training.planning.chain import training_chain
    from megatron_mm.training.assembly.data_setup import batch_iterator, batch_iterators
    from megatron_mm.training.assembly.model_setup import (build_model_chunks,
                                                           setup_model_and_optimizer)
    from megatron_mm.training.pretrain import setup_training
    from megatron_mm.training.config.run_config import RunConfig
    from megatron_mm.training.planning.recompute import describe_choice
    from megatron_mm.training.assembly.initialize import batch_to_device
    from megatron_mm.training.loop.step import train_step
    from megatron_mm.training.planning.training_plan import plan_pipeline

    args = parse_args(train_argv)
    if args.pipeline_model_parallel_size != 1 or args.world_size != 1:
        print("bench_recompute.py runs one process: drop the parallel flags", file=sys.stderr)
        return 2
    budget_flag = args.recompute_memory_budget
    args.recompute_memory_budget = None
    args.recompute_granularity = args.recompute_method = args.recompute_num_layers = None
    run = setup_training(RunConfig.from_flags(args))

    # 1. the per-layer profile (times and saved bytes), as tools/profile_layers.py writes it
    chain = training_chain(run.config, run.model_config)
    data = batch_iterator(run.config, run.train_ds, run.tokenizer, 0, shuffle=True)
    profile = profile_layers(run.model[0], chain, [batch_to_device(next(data))
                                                   for _ in range(3)], warmup=1)
    path = os.path.join(tempfile.mkdtemp(), "profile.json")
    profile.save(path)
    args.pipeline_profile = path
    model_config = run.model_config
    chain = training_chain(RunConfig.from_flags(args), model_config)
    bounds = StagePartition(1, 1, [len(chain)]).chunk_bounds()
    (acts,) = chunk_activations(chain, bounds, 1, 1, args.num_microbatches)
    static = static_bytes(chain, bounds, 1, MemoryModel())[0]
    full_n = acts.max_stack_layers
    budget = budget_flag or (static + (acts.bytes_with(0) + acts.bytes_with(full_n)) / 2) / GB
    # the same N for every stack (the fewest that fit): what the knapsack improves on
    same_n = next((n for n in range(full_n + 1)
                   if static + acts.bytes_with(n) <= budget * GB), full_n)
    del run

    runs = {}
    modes = [("none", dict()),
             ("full", dict(recompute_granularity="full", recompute_method="block",
                           recompute_num_layers=full_n)),
             ("same N", dict(recompute_granularity="full", recompute_method="block",
                             recompute_num_layers=same_n)),
             ("adaptive", dict(recompute_memory_budget=budget, recompute_granularity="full",
                               recompute_method="block"))]
    for name, flags in modes:
        for key in ("recompute_granularity", "recompute_method", "recompute_num_layers",
                    "recompute_memory_budget"):
            setattr(args, key, flags.get(key))
        set_random_seed(args.seed)
        config = RunConfig.from_flags(args)
        chunks = build_model_chunks(config, run_tokenizer(args), model_config,
                                    plan_pipeline(config, model_config))
        choice = "-"
        if name == "adaptive":
            choice = describe_choice(config, StagePartition(1, 1, [len(chain)]), chain)
        ddp, optimizer, scheduler = setup_model_and_optimizer(config, chunks)
        tokenizer = run_tokenizer(args)
        data = batch_iterators(config, _datasets(config, tokenizer), tokenizer, 0, shuffle=True)
        train_step(config, ddp, optimizer, scheduler, data)  # warm-up
        runs[name] = dict(step=(ddp, optimizer, scheduler, data), n=recomputed(chunks[0]),
                          config=config,
                          times=[], loss=None, choice=choice)
    # Round robin: one timed iteration of each mode per round, so drift on a shared
    # machine hits all modes alike; no hooks while timing (their Python cost).
    for _ in range(ours.bench_iters):
        for r in runs.values():
            start = _clock()
            r["loss"] = train_step(r["config"], *r["step"][:3], r["step"][3]).loss
            r["times"].append(_clock() - start)
    rows = []
    for name, r in runs.items():
        ddp, optimizer, scheduler, data = r["step"]
        tracker = LiveSavedBytes(parameter_storages(ddp))
        with torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack):
            train_step(r["config"], ddp, optimizer, scheduler, data)  # the peak: one more
        rows.append((name, r["n"], statistics.median(r["times"]), tracker.peak,
                     state_bytes(ddp, optimizer), r["loss"], r["choice"]))

    budget_from = ("--recompute-memory-budget" if budget_flag
                   else "halfway between none and full")
    print(f"\nrecompute benchmark: {args.num_microbatches} micro-batches of "
          f"{args.micro_batch_size} x {args.seq_length} tokens per iteration, "
          f"median of {ours.bench_iters} iterations, {torch.get_num_threads()} threads; "
          f"budget {budget:.4f} GB (= GiB, 2^30 bytes as Megatron's flags; {budget_from}); "
          f"model-estimated static {static / GB:.4f} GB")
    print("| recompute | layers recomputed / built per stack | iteration s "
          "| peak saved-activation MiB | model state MiB | state + peak act. GiB | within budget "
          "| last loss |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, n, t, peak, state, loss, _ in rows:
        total = (state + peak) / GB
        print(f"| {name} | {n} | {t:.4f} | {peak / 2 ** 20:.2f} | "
              f"{state / 2 ** 20:.2f} | "
              f"{total:.4f} | {'yes' if total <= budget else 'no'} | {loss:.6f} |")
    print(rows[-1][-1])
    shutdown_distributed()
    return 0


_CACHE: dict = {}


def recomputed(chunk) -> str:
    """``vision 3/8, llm 5/8``: each stack's recompute_num_layers and its layers."""
    parts = []
    for stack in ("vision", "audio", "language"):
        module = getattr(chunk, f"{stack}_model", None)
        if module is None or module.decoder is None:
            continue
        config = module.decoder.config
        n = config.recompute_num_layers if config.recompute_granularity else 0
        layers = len(module.decoder.layers)
        parts.append(f"{'llm' if stack == 'language' else stack} {min(n, layers)}/{layers}")
    return ", ".join(parts)


def run_tokenizer(args):
    from megatron_mm.data import build_tokenizer

    if "tok" not in _CACHE:
        _CACHE["tok"] = build_tokenizer(args.tokenizer_type, args.tokenizer_model,
                                        image_token_id=args.image_token_id,
                                        audio_token_id=args.audio_token_id,
                                        video_token_id=args.video_token_id)
    return _CACHE["tok"]


def _datasets(config, tokenizer):
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.training.assembly.data_setup import build_datasets

    if "train" not in _CACHE:
        _CACHE["train"] = build_datasets(config, tokenizer)[0]
    return _CACHE["train"]


if __name__ == "__main__":
    sys.exit(main())
