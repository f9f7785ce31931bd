"""ISF packing: bounds hold, every sample lands once, oversize samples are reported."""

import random

import pytest

from megatron_mm.plan import PlanError
from megatron_mm.plan.balance import Bounds, SampleLoad, isf, random_groups


def synthetic(n, seed=0):
    rng = random.Random(seed)
    return [SampleLoad(rng.randint(0, 4), rng.randint(30, 300)) for _ in range(n)]


def test_groups_hold_bounds_and_every_sample_once():
    loads = synthetic(2000)
    bounds = Bounds(16, 1024, 16, 960)
    g = isf(range(len(loads)), loads, bounds, 10, random.Random(1))
    flat = [i for grp in g.groups for i in grp]
    assert sorted(flat) == list(range(len(loads))) and not g.oversize
    for grp in g.groups:
        assert sum(loads[i].vision for i in grp) <= 16
        assert sum(loads[i].tokens for i in grp) <= 1024
    # filtering makes groups fuller than one greedy pass
    one = random_groups(range(len(loads)), loads, bounds, random.Random(1))
    assert len(g.groups) < len(one)


def test_oversize_samples_are_reported_not_dropped():
    loads = synthetic(50) + [SampleLoad(40, 10), SampleLoad(1, 5000)]
    g = isf(range(len(loads)), loads, Bounds(16, 1024), 5, random.Random(0))
    assert g.oversize == [50, 51]
    assert sorted(i for grp in g.groups for i in grp) == list(range(50))


def test_deterministic_from_the_seed():
    loads = synthetic(500)
    a = isf(range(500), loads, Bounds(12, 800), 5, random.Random("7:0")).groups
    b = isf(range(500), loads, Bounds(12, 800), 5, random.Random("7:0")).groups
    c = isf(range(500), loads, Bounds(12, 800), 5, random.Random("8:0")).groups
    assert a == b and a != c


def test_bad_bounds_name_the_problem():
    with pytest.raises(PlanError, match="must be positive"):
        Bounds(0, 100)
    with pytest.raises(PlanError, match="at least one iteration"):
        isf([0], [SampleLoad(1, 1)], Bounds(1, 1), 0, random.Random(0))
