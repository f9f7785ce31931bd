"""OmniBal's balance metrics, per step, averaged over steps.

A *step* is one micro-batch on each of N data-parallel ranks; ``steps`` below are lists of
N micro-batches, each a list of sample indices.

- padding ratio of a rank's micro-batch of B samples padded to the longest, t_max:
  ``sum_i (t_max - t_i) / (t_max * B)``; 0 for a packed sequence (no pad tokens). Per step
  it is the mean over ranks.
- imbalance across the N ranks of a step: ``sum_r (T_max - T_r) / (T_max * N)``, with T_r
  a rank's total vision tiles (vision imbalance) or the LLM tokens it computes (LLM
  imbalance): t_max * B for a padded micro-batch, the sum of lengths for a packed one;
  or, given the model (``llm_work``), the LLM FLOPs of those sequences. 0 means every
  rank has the same work; it is the mean idle share of the ranks while the slowest finishes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from .loads import SampleLoad


def padding_ratio(tokens: Sequence[int]) -> float:
    longest = max(tokens)
    return sum(longest - t for t in tokens) / (longest * len(tokens))


def imbalance(work: Sequence[float]) -> float:
    top = max(work)
    return 0.0 if top == 0 else sum(top - w for w in work) / (top * len(work))


@dataclass
class BalanceMetrics:
    padding: float
    vision_imbalance: float
    llm_imbalance: float
    samples_per_microbatch: float
    steps: int


def measure(steps: Sequence[Sequence[Sequence[int]]], loads: Sequence[SampleLoad],
            packed: bool, llm_work: Optional[Callable[[int], float]] = None
            ) -> BalanceMetrics:
    """Metrics of ``steps`` (each: one list of sample indices per rank). ``llm_work``: a
    sample's LLM work from its tokens (``llm_work.LLMWork``: the model's layer FLOPs);
    default the tokens themselves."""
    work = llm_work or (lambda t: t)
    if not steps:
        raise ValueError("no complete step to measure")
    pad = vis = llm = 0.0
    samples = microbatches = 0
    for step in steps:
        tokens = [[loads[i].tokens for i in mb] for mb in step]
        if not packed:
            pad += sum(padding_ratio(t) for t in tokens) / len(step)
        vis += imbalance([sum(loads[i].vision for i in mb) for mb in step])
        llm += imbalance([sum(work(x) for x in t) if packed else work(max(t)) * len(t)
                          for t in tokens])
        samples += sum(len(mb) for mb in step)
        microbatches += len(step)
    n = len(steps)
    return BalanceMetrics(pad / n, vis / n, llm / n, samples / microbatches, n)
