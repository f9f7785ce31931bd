"""``--pipeline-partition search``: time the best-ranked candidates on the real model.

The candidates come from ``plan.partition_search`` (anchor +-``--pipeline-search-radius``,
ranked by rank-time variance and boundary bytes) on the per-layer times of
``--pipeline-profile`` or, without one, of the cost model. The top
``--pipeline-search-candidates`` each get their model chunks built and run
``--pipeline-search-iters`` real training iterations (forward and backward on real
batches, optimizer step); a candidate's time is the max over ranks of its median
iteration. The trials draw batches from their own iterator and the RNG is reseeded
afterwards, so the run then builds the fastest partition exactly as it would have built
it given explicitly: same initialisation, same data order.
"""

from __future__ import annotations

import statistics
from typing import Callable, List

import torch

from ...plan.errors import PlanError
from ...plan.pipeline.partition_search import candidates, fastest, table
from ...runtime.collective_device import collective_device
from ...runtime.timer import DeviceTimer
from ..assembly.initialize import device
from .chain import training_chain
from .time_inputs import hardware


def layer_time_source(pipeline) -> str:
    if pipeline.pipeline_profile:
        return f"measured profile {pipeline.pipeline_profile}"
    return "cost model (FLOPs; no --pipeline-profile)"


def ranked_candidates(config, chain=None):
    return candidates(chain if chain is not None else training_chain(config),
                      config.parallel.pipeline_model_parallel_size,
                      config.parallel.virtual_pipeline_model_parallel_size or 1,
                      config.pipeline.pipeline_search_radius,
                      hardware=hardware(config.pipeline))


def time_candidate(pipeline, build: Callable, batches: Callable, step: Callable) -> float:
    """Max over ranks of the median iteration time of a freshly built model."""
    run = build()
    data = batches()
    step(run, data)  # warm-up, untimed: first-call allocations and lazy initialisation
    times: List[float] = []
    timer = DeviceTimer(device())
    for _ in range(pipeline.pipeline_search_iters):
        torch.distributed.barrier()
        timer.start()
        step(run, data)
        times.append(timer.stop())
    median = torch.tensor([statistics.median(times)], dtype=torch.float64,
                          device=collective_device())
    torch.distributed.all_reduce(median, op=torch.distributed.ReduceOp.MAX)
    return float(median.item())


def search_partition(config, chain, build: Callable, batches: Callable, step: Callable,
                     reseed: Callable, log: Callable[[str], None]) -> List[int]:
    """Times the top candidates, prints the table, returns the fastest's layer counts.
    ``build(layers_per_chunk)`` builds model and optimizer for that partition,
    ``batches()`` a fresh batch iterator, ``step(run, data)`` one training iteration,
    ``reseed()`` restores the RNG the run started with."""
    found = ranked_candidates(config, chain)
    timed, unfit = [], []
    for cand in found:
        if len(timed) == config.pipeline.pipeline_search_candidates:
            break
        try:
            cand.measured_s = time_candidate(
                config.pipeline, lambda: build(list(cand.layers_per_chunk)), batches, step)
        except PlanError as e:  # a partition the run cannot take (over the memory
            # budget, say): planned alike on every rank, so every rank skips it
            unfit.append(f"{','.join(map(str, cand.layers_per_chunk))} ({e})")
            continue
        timed.append(cand)
    if not timed:
        raise PlanError("--pipeline-partition search: no candidate partition can run: "
                        + "; ".join(unfit))
    best = fastest(timed)
    log(table(found[:max(len(timed), min(len(found), 2 * len(timed)))],
              layer_time_source(config.pipeline))
        + f"\n   {len(found)} candidates within +-{config.pipeline.pipeline_search_radius} layers; "
          + (f"skipped {'; '.join(unfit)}; " if unfit else "")
          + f"kept {','.join(map(str, best.layers_per_chunk))} "
          f"({best.measured_s:.4f} s/iteration)")
    reseed()
    return list(best.layers_per_chunk)
