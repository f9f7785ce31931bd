"""The balanced sampler: exactly once per epoch over all ranks, deterministic, resumable
mid-epoch and across epochs, balanced rounds, oversize samples named."""

import itertools
import random

import pytest

from megatron_mm.plan import PlanError
from megatron_mm.plan.balance import (BalancedSampler, Bounds, SampleLoad, measure,
                                      search_bounds, split_to_multiple)

DP, STEP_MBS = 2, 3  # data-parallel ranks, micro-batches per step


def synthetic(n=600, seed=0):
    rng = random.Random(seed)
    return [SampleLoad(rng.randint(1, 4), rng.randint(20, 200)) for _ in range(n)]


LOADS = synthetic()
BOUNDS = Bounds(12, 520, 12, 470)


def samplers(consumed=0, seed=5, method="isf-sorted"):
    return [BalancedSampler(LOADS, BOUNDS, r, DP, STEP_MBS, seed=seed,
                            consumed_microbatches=consumed, method=method)
            for r in range(DP)]


def take(sampler, n):
    return list(itertools.islice(iter(sampler), n))


@pytest.mark.parametrize("method", ["isf", "isf-sorted"])
def test_each_sample_exactly_once_per_epoch(method):
    s = samplers(method=method)
    rounds = len(s[0].epoch_plan(0))
    assert rounds % STEP_MBS == 0  # whole global batches, nothing left over
    for epoch in range(2):
        seen = [i for r in range(DP) for mb in take(s[r], rounds * (epoch + 1))[-rounds:]
                for i in mb]
        assert sorted(seen) == list(range(len(LOADS)))
        for r in range(DP):
            for mb in take(s[r], rounds):
                assert BOUNDS.fits(SampleLoad(sum(LOADS[i].vision for i in mb),
                                              sum(LOADS[i].tokens for i in mb)))


def test_deterministic_from_seed_and_epochs_differ():
    a, b = samplers(seed=5)[1], samplers(seed=5)[1]
    assert take(a, 200) == take(b, 200)
    assert take(a, 50) != take(samplers(seed=6)[1], 50)
    assert a.epoch_plan(0) != a.epoch_plan(1)


@pytest.mark.parametrize("steps_done", [1, 7])
def test_resume_mid_epoch_and_across_epochs(steps_done):
    whole = [take(s, 150) for s in samplers()]
    rounds = len(samplers()[0].epoch_plan(0))
    for done in (steps_done * STEP_MBS, rounds + steps_done * STEP_MBS):  # epoch 0, 1
        resumed = [take(s, 150 - done) for s in samplers(consumed=done * DP)]
        assert resumed == [w[done:] for w in whole]


def test_rounds_balance_ranks():
    s = samplers()[0]
    sorted_m = measure(s.epoch_plan(0), LOADS, packed=True)
    random_m = measure(samplers(method="isf")[0].epoch_plan(0), LOADS, packed=True)
    assert sorted_m.llm_imbalance < random_m.llm_imbalance / 3
    assert sorted_m.vision_imbalance < random_m.vision_imbalance / 3


def test_oversize_sample_is_named():
    loads = LOADS + [SampleLoad(1, 9999)]
    with pytest.raises(PlanError, match="record-x: 1 tiles / 9999 tokens exceed"):
        BalancedSampler(loads, BOUNDS, 0, DP, sample_names=[""] * len(LOADS) + ["record-x"])


def test_bad_arguments():
    with pytest.raises(PlanError, match="multiple of one global batch"):
        BalancedSampler(LOADS, BOUNDS, 0, DP, STEP_MBS, consumed_microbatches=3)
    with pytest.raises(PlanError, match="--data-balance 'lpt'"):
        BalancedSampler(LOADS, BOUNDS, 0, DP, method="lpt")
    with pytest.raises(PlanError, match="cannot split 2 of 2 packed sequences"):
        split_to_multiple([[0], [1]], LOADS, 4)
    a, b, *rest = split_to_multiple([[0, 1, 2], [3, 4], [5]], LOADS, 4)
    assert a and b and a + b == [0, 1, 2] and rest == [[3, 4], [5]]


def test_search_respects_the_cap_and_the_target():
    best = search_bounds(LOADS, DP, 4, max_tokens=600)
    assert best.bounds.max_tokens <= 600 and best.bounds.max_vision >= 4
    assert 4 <= best.metrics.samples_per_microbatch <= 5
    with pytest.raises(PlanError, match="more than the packed length cap 150"):
        search_bounds(LOADS, DP, 4, max_tokens=150)
