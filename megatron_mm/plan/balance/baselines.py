"""Batching baselines: micro-batches of a fixed sample count, padded to their longest.

- random: shuffle, cut into micro-batches of ``B`` samples;
- length-sorted: sort by tokens, cut into micro-batches of ``B`` neighbours (little
  padding), micro-batches in random order (LLaVA-style length grouping, taken to the limit).

Consecutive runs of ``dp`` micro-batches form a step; an incomplete last step is dropped.
"""

from __future__ import annotations

import random
from typing import List, Sequence

from .loads import SampleLoad


def steps_of(microbatches: Sequence[List[int]], dp: int) -> List[List[List[int]]]:
    return [list(microbatches[k:k + dp]) for k in range(0, len(microbatches) - dp + 1, dp)]


def random_batches(loads: Sequence[SampleLoad], per_microbatch: int,
                   rng: random.Random) -> List[List[int]]:
    order = list(range(len(loads)))
    rng.shuffle(order)
    return [order[k:k + per_microbatch]
            for k in range(0, len(order) - per_microbatch + 1, per_microbatch)]


def length_sorted_batches(loads: Sequence[SampleLoad], per_microbatch: int,
                          rng: random.Random) -> List[List[int]]:
    order = list(range(len(loads)))
    rng.shuffle(order)  # random among equal lengths
    order.sort(key=lambda i: loads[i].tokens)
    mbs = [order[k:k + per_microbatch]
           for k in range(0, len(order) - per_microbatch + 1, per_microbatch)]
    rng.shuffle(mbs)
    return mbs
