"""The balanced sampler: this rank's packed micro-batches, epoch by epoch, resumable.

Epoch e is planned from ``seed`` and e alone: ISF packs every sample into groups (each one
packed sequence, one rank's micro-batch), the largest groups are split until the count
fills whole global batches (``dp`` x micro-batches per step), and the groups are placed in
rounds (one group per rank; ``rounds.py``). Round k's group r goes to data-parallel rank r.
So every sample is trained on exactly once per epoch, the order is the same on every run,
and a sampler built with ``consumed_microbatches`` (global packed micro-batches already
trained on, all ranks together) continues exactly where the interrupted run stopped.
"""

from __future__ import annotations

import random
from typing import Iterator, List, Sequence

from ..errors import PlanError
from .isf import Bounds, isf
from .loads import SampleLoad
from .rounds import ROUNDS, split_to_multiple


class BalancedSampler:
    def __init__(self, loads: Sequence[SampleLoad], bounds: Bounds, data_parallel_rank: int,
                 data_parallel_size: int, microbatches_per_step: int = 1, seed: int = 0,
                 consumed_microbatches: int = 0, method: str = "isf-sorted",
                 iterations: int = 10, sample_names: Sequence[str] | None = None):
        if method not in ROUNDS:
            raise PlanError(f"--data-balance {method!r}: expected one of {sorted(ROUNDS)}")
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise PlanError(f"data-parallel rank {data_parallel_rank} not in "
                            f"[0, {data_parallel_size})")
        self.step = data_parallel_size * microbatches_per_step
        if consumed_microbatches < 0 or consumed_microbatches % self.step:
            raise PlanError(f"consumed micro-batches {consumed_microbatches} is not a "
                            f"non-negative multiple of one global batch ({self.step})")
        for i, load in enumerate(loads):
            if not bounds.fits(load):  # reported, never dropped
                name = sample_names[i] if sample_names else f"sample {i}"
                raise PlanError(f"{name}: {load.vision} tiles / {load.tokens} tokens exceed "
                                f"the balance bounds {bounds}")
        self.loads, self.bounds = loads, bounds
        self.rank, self.dp = data_parallel_rank, data_parallel_size
        self.seed, self.method, self.iterations = seed, method, iterations
        self.consumed_microbatches = consumed_microbatches
        self._cache: tuple[int, List[List[List[int]]]] | None = None

    def epoch_plan(self, epoch: int) -> List[List[List[int]]]:
        """Rounds of epoch ``epoch``: ``dp`` groups (lists of sample indices) each."""
        if self._cache is None or self._cache[0] != epoch:
            rng = random.Random(f"{self.seed}:{epoch}")  # str seeds hash the same everywhere
            groups = isf(range(len(self.loads)), self.loads, self.bounds, self.iterations,
                         rng).groups
            groups = split_to_multiple(groups, self.loads, self.step)
            self._cache = epoch, ROUNDS[self.method](groups, self.loads, self.dp, rng)
        return self._cache[1]

    def __iter__(self) -> Iterator[List[int]]:
        # Starts from the constructor's count every time (no hidden progress), as
        # MegatronPretrainingSampler does: resuming means building a new sampler.
        epoch, skip = 0, self.consumed_microbatches // self.dp
        while skip >= len(self.epoch_plan(epoch)):
            skip -= len(self.epoch_plan(epoch))
            epoch += 1
        while True:
            for round_ in self.epoch_plan(epoch)[skip:]:
                yield list(round_[self.rank])
            epoch, skip = epoch + 1, 0
