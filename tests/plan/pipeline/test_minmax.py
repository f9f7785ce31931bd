"""The frozen-aware min-max DP equals brute force over every contiguous split."""

import dataclasses
import itertools
import random

import pytest

from megatron_mm.plan import MemoryModel, PlanError, inflight_microbatches, minmax_split, partition

from helpers import random_chain, vlm_chain


def splits(n, groups):
    for cuts in itertools.combinations(range(1, n), groups - 1):
        bounds = (0,) + cuts + (n,)
        yield [bounds[i + 1] - bounds[i] for i in range(groups)]


def chunk_bounds(sizes):
    start = 0
    for size in sizes:
        yield start, start + size
        start += size


def stage_time(chain, start, end):
    return sum(l.fwd_flops + l.bwd_flops for l in chain[start:end])


def chunk_memory(chain, start, end, chunk, pp, vpp, m):
    """Written out from the memory rule (16 / 2 bytes per param, in-flight activations)."""
    inflight = inflight_microbatches(pp, vpp, chunk % pp, m)[chunk // pp]
    params = sum(l.params * (16 if l.trainable else 2) for l in chain[start:end])
    return params + inflight * sum(l.stored_act_bytes for l in chain[start:end])


def brute_force(chain, pp, vpp, m, limit, weight=None):
    weight = weight or (lambda l: l.fwd_flops + l.bwd_flops)
    best = None
    for sizes in splits(len(chain), pp * vpp):
        ok = limit is None or all(
            chunk_memory(chain, s, e, c, pp, vpp, m) <= limit / vpp
            for c, (s, e) in enumerate(chunk_bounds(sizes)))
        if ok:
            value = max(sum(weight(l) for l in chain[s:e]) for s, e in chunk_bounds(sizes))
            best = value if best is None else min(best, value)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_auto_equals_brute_force(seed):
    rng = random.Random(seed)
    chain = random_chain(rng, rng.randint(1, 4), rng.randint(1, 5))
    pp = rng.choice([1, 2, 3, 4])
    vpp = 2 if pp * 2 <= len(chain) and rng.random() < 0.3 else 1
    m = rng.randint(1, 6)
    unconstrained = brute_force(chain, pp, vpp, m, None)
    part = partition(chain, pp, vpp, "auto", num_microbatches=m)
    assert max(stage_time(chain, s, e) for s, e in part.chunk_bounds()) == unconstrained

    # a limit between the least and the most memory any split needs: often binding
    mems = [max(chunk_memory(chain, s, e, c, pp, vpp, m)
                for c, (s, e) in enumerate(chunk_bounds(sizes)))
            for sizes in splits(len(chain), pp * vpp)]
    limit = rng.uniform(min(mems) * 0.9, max(mems)) * vpp
    expected = brute_force(chain, pp, vpp, m, limit)
    if expected is None:
        with pytest.raises(PlanError, match="memory limit"):
            partition(chain, pp, vpp, "auto", limit, num_microbatches=m)
        return
    part = partition(chain, pp, vpp, "auto", limit, num_microbatches=m)
    bounds = part.chunk_bounds()
    assert max(stage_time(chain, s, e) for s, e in bounds) == expected
    assert all(chunk_memory(chain, s, e, c, pp, vpp, m) <= limit / vpp
               for c, (s, e) in enumerate(bounds))


@pytest.mark.parametrize("seed", range(10))
def test_balanced_is_minmax_of_3F(seed):
    rng = random.Random(100 + seed)
    chain = random_chain(rng, rng.randint(1, 4), rng.randint(2, 5))
    pp = rng.choice([2, 3])
    part = partition(chain, pp, 1, "balanced")

    def weight(l):
        return (4 if l.recompute else 3) * l.fwd_flops

    got = max(sum(weight(l) for l in chain[s:e]) for s, e in part.chunk_bounds())
    assert got == brute_force(chain, pp, 1, None, None, weight)


@pytest.mark.parametrize("seed", range(20))
def test_minmax_split_with_stage_dependent_costs(seed):
    rng = random.Random(200 + seed)
    n, groups = rng.randint(1, 9), rng.randint(1, 5)
    values = [rng.randint(0, 20) for _ in range(n)]
    scale = [rng.randint(1, 4) for _ in range(groups)]

    def cost(i, j, g):
        return scale[g] * sum(values[i:j])

    value, sizes = minmax_split(n, groups, cost)
    if n < groups:
        assert sizes is None
        return
    expected = min(max(cost(s, e, g) for g, (s, e) in enumerate(chunk_bounds(c)))
                   for c in splits(n, groups))
    assert value == expected and sum(sizes) == n and min(sizes) >= 1
    assert max(cost(s, e, g) for g, (s, e) in enumerate(chunk_bounds(sizes))) == expected


def test_memory_limit_moves_layers_to_later_stages():
    # 14 trained layers costing 2,3,3,...: the free optimum is [7, 7] (20 vs 21). Stage 0
    # keeps 2 micro-batches in flight, stage 1 one; at 10 B per layer and 100 B per stage,
    # stage 0 can hold 5 layers.
    chain = [dataclasses.replace(l, act_bytes=10.0)
             for l in vlm_chain(0, 10, freeze_vit=False, freeze_llm=False)]
    assert partition(chain, 2, 1, "auto", num_microbatches=8).layers_per_chunk == [7, 7]
    no_state = MemoryModel(bytes_per_trainable_param=0.0)
    tight = partition(chain, 2, 1, "auto", 100.0, num_microbatches=8, memory=no_state)
    assert tight.layers_per_chunk == [5, 9]
    with pytest.raises(PlanError, match=r"memory limit .*--memory-limit-gb"):
        partition(chain, 2, 1, "auto", 89.0, num_microbatches=8, memory=no_state)


def test_ties_prefer_later_stages_larger():
    # in 1F1B later stages keep fewer micro-batches in flight: among optimal splits the
    # last group is as large as the optimum allows, then the one before it, ...
    assert minmax_split(5, 2, lambda i, j, g: j - i) == (3, [2, 3])
    assert minmax_split(7, 3, lambda i, j, g: j - i) == (3, [2, 2, 3])
    assert minmax_split(8, 3, lambda i, j, g: j - i) == (3, [2, 3, 3])
