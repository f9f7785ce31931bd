"""Place packed groups on data-parallel ranks: one group per rank per round.

A *round* is one micro-batch on each of the ``dp`` ranks; ranks wait for the slowest
group of the round (at the gradient all-reduce, and at every pipeline hand-off).

- ``random_rounds``: groups in random order, ``dp`` at a time (OmniBal's placement);
- ``sorted_rounds``: groups sorted by (tiles, tokens) and cut into runs of ``dp``
  neighbours, so the groups of a round carry nearly the same vision and LLM work; rounds
  then go in random order and groups to random ranks, so the training order stays random
  from round to round.
"""

from __future__ import annotations

import random
from typing import List, Sequence

from ..errors import PlanError
from .loads import SampleLoad


def _work(group: Sequence[int], loads: Sequence[SampleLoad]):
    return (sum(loads[i].vision for i in group), sum(loads[i].tokens for i in group))


def random_rounds(groups: Sequence[List[int]], loads: Sequence[SampleLoad], dp: int,
                  rng: random.Random) -> List[List[List[int]]]:
    order = list(groups)
    rng.shuffle(order)
    return [order[k:k + dp] for k in range(0, len(order) - dp + 1, dp)]


def sorted_rounds(groups: Sequence[List[int]], loads: Sequence[SampleLoad], dp: int,
                  rng: random.Random) -> List[List[List[int]]]:
    order = list(groups)
    rng.shuffle(order)  # ties in random order
    order.sort(key=lambda g: _work(g, loads))
    rounds = [order[k:k + dp] for k in range(0, len(order) - dp + 1, dp)]
    rng.shuffle(rounds)
    for r in rounds:
        rng.shuffle(r)
    return rounds


ROUNDS = {"isf": random_rounds, "isf-sorted": sorted_rounds}


def split_to_multiple(groups: List[List[int]], loads: Sequence[SampleLoad],
                      multiple: int) -> List[List[int]]:
    """Split the largest groups in two until the group count is a multiple of ``multiple``,
    so an epoch fills whole global batches and no sample is left out."""
    if not groups:
        raise PlanError("no samples to pack")
    need = -len(groups) % multiple
    splittable = sorted((g for g in groups if len(g) > 1), key=lambda g: -len(g))
    if len(splittable) < need:
        raise PlanError(f"cannot split {need} of {len(groups)} packed sequences to fill the "
                        f"last global batch of {multiple} micro-batches: use more data or a "
                        "smaller --global-batch-size")
    chosen = {id(g) for g in splittable[:need]}
    out: List[List[int]] = []
    for g in groups:
        if id(g) in chosen:
            half = _halve(g, loads)
            out += [g[:half], g[half:]]
        else:
            out.append(g)
    return out


def _halve(group: List[int], loads: Sequence[SampleLoad]) -> int:
    """The cut (1 .. len-1) that halves the group's tokens most evenly."""
    total, run, best, best_gap = sum(loads[i].tokens for i in group), 0, 1, None
    for k in range(1, len(group)):
        run += loads[group[k - 1]].tokens
        gap = abs(total - 2 * run)
        if best_gap is None or gap < best_gap:
            best, best_gap = k, gap
    return best
