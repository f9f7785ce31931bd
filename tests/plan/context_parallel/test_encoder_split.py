"""Encoder items over CP ranks (--vision-dp-when-cp): every item once, in order, the
busiest rank as low as whole items allow."""

import itertools
import random

import pytest

from megatron_mm.plan import PlanError
from megatron_mm.plan.context_parallel.encoder_split import EncoderSplit, split_items


def test_every_item_once_and_work_per_rank():
    work = [400, 16, 144, 36, 576, 4, 64]
    split = split_items(work, 3)
    assert sorted(i for r in range(3) for i in split.items(r)) == list(range(len(work)))
    assert all(split.items(r) == sorted(split.items(r)) for r in range(3))
    assert split.work == [sum(work[i] for i in split.items(r)) for r in range(3)]
    assert EncoderSplit.from_json(split.to_json()) == split


@pytest.mark.parametrize("seed", range(5))
def test_few_items_reach_the_optimum(seed):
    rng = random.Random(seed)
    work = [rng.choice(range(4, 577, 4)) for _ in range(rng.randint(2, 9))]
    best = min(max(sum(w for w, o in zip(work, owner) if o == r) for r in range(2))
               for owner in itertools.product(range(2), repeat=len(work)))
    assert max(split_items(work, 2).work) == best


def test_equal_items_alternate_and_fewer_items_than_ranks():
    assert split_items([1] * 5, 2).owner == [0, 1, 0, 1, 0]
    assert split_items([9], 4).work == [9, 0, 0, 0]
    assert split_items([], 2).owner == []
    with pytest.raises(PlanError, match="must be >= 0"):
        split_items([1, -1], 2)
