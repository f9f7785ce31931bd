"""CP token assignment: every token once, loads as planned, LPT + refinement balanced."""

import numpy as np
import pytest

from megatron_mm.plan import PlanError
from megatron_mm.plan.context_parallel.attention_mask import dense_allowed
from megatron_mm.plan.context_parallel.cp_assignment import (CPAssignment, METHODS, assign_tokens,
                                                             block_loads, lpt, refine)
from megatron_mm.reproductions.mask_families import FAMILIES, family_codes


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_token_once_and_loads_from_dense_tiles(method, family):
    codes = family_codes(family, 300, seed=1)
    a = assign_tokens(codes, 4, method, block=16)
    flat = sorted(i for t in a.tokens for i in t)
    assert flat == list(range(300))
    assert all(t == sorted(t) for t in a.tokens)
    allowed = dense_allowed(codes)
    for r, toks in enumerate(a.tokens):
        blocks = sorted({i // 16 for i in toks})
        tiles = sum(allowed[b * 16:(b + 1) * 16, k * 16:(k + 1) * 16].any()
                    for b in blocks for k in range(-(-300 // 16)))
        assert a.attention[r] == tiles


def test_zigzag_and_contiguous_layouts():
    codes = family_codes("causal", 64)
    z = assign_tokens(codes, 2, "zigzag", block=8)
    assert z.tokens[0] == list(range(16)) + list(range(48, 64))
    c = assign_tokens(codes, 2, "contiguous", block=8)
    assert c.tokens[1] == list(range(32, 64))


def test_ours_balances_every_family_at_8_ranks():
    for family in FAMILIES:
        a = assign_tokens(family_codes(family, 16384, seed=0), 8, "ours")
        assert a.imbalance("cost") <= 1.03, family


def test_refinement_beats_lpt_where_lpt_is_off():
    # Graham's bad case: LPT gives {5,4}, {5,3,3} = 11 on 2 ranks.
    load = np.array([5.0, 5.0, 4.0, 3.0, 3.0])  # total 20: optimum 10 ({5,5}, {4,3,3})
    before = lpt(load, 2)
    after = refine(load, before, 2)
    makespan = lambda o: max(load[o == r].sum() for r in range(2))  # noqa: E731
    assert makespan(before) == 11
    assert makespan(after) == 10


def test_unequal_token_counts_where_work_says_so():
    # Causal, 3 blocks of 8: loads 1+1, 2+1, 3+1 tiles -> {last block}, {first two}.
    a = assign_tokens(family_codes("causal", 24), 2, "ours", block=8, block_overhead=0)
    assert a.tokens == [list(range(16, 24)), list(range(16))]
    assert a.load == [4.0, 5.0]


def test_block_overhead_counts_once_per_block():
    # Causal, 4 blocks of 8: tiles 1, 2, 3, 4. Without overhead {4, 1} / {3, 2} ties (5 / 5)
    # whatever the block counts; with 10 tiles per block, {4} / {1, 2, 3} is 14 / 36.
    codes = family_codes("causal", 32)
    plain = assign_tokens(codes, 2, "ours", block=8, linear_weight=0, block_overhead=0)
    heavy = assign_tokens(codes, 2, "ours", block=8, linear_weight=0, block_overhead=10)
    assert sorted(plain.blocks) == [2, 2] and sorted(heavy.blocks) == [2, 2]
    assert heavy.cost == [a + 10 * n for a, n in zip(heavy.attention, heavy.blocks)]
    assert heavy.load == heavy.cost  # no linear term: load is the attention time
    lop = assign_tokens(codes, 2, "contiguous", block=8, linear_weight=0, block_overhead=10)
    assert lop.cost == [1 + 2 + 20, 3 + 4 + 20] and lop.imbalance("cost") == 27 / 25
    with pytest.raises(PlanError, match="--context-parallel-block-overhead"):
        assign_tokens(codes, 2, block=8, block_overhead=-1)


def test_overhead_evens_block_counts_when_tiles_allow():
    # Two heavy blocks vs four light ones of the same tiles: the overhead breaks the tie.
    load_tiles = np.array([4.0, 4.0, 2.0, 2.0, 2.0, 2.0])
    from megatron_mm.plan.context_parallel.cp_assignment import ours

    owner = ours(load_tiles + 3.0, 2)
    assert sorted(int((owner == r).sum()) for r in range(2)) == [3, 3]


def test_too_short_to_split_is_replicated():
    a = assign_tokens(family_codes("causal", 20), 4, "ours", block=8)
    assert a.replicated and all(t == list(range(20)) for t in a.tokens)


def test_batch_rows_share_one_assignment_and_loads_add():
    codes = np.stack([family_codes("prefix_lm", 64, seed=s) for s in range(2)])
    tiles, _ = block_loads(codes, 8)
    single = sum(block_loads(c, 8)[0] for c in codes)
    assert (tiles == single).all()


def test_record_round_trip_and_bad_method():
    a = assign_tokens(family_codes("packed", 128), 2, block=16)
    assert CPAssignment.from_json(a.to_json()) == a
    with pytest.raises(PlanError, match="--context-parallel-assignment"):
        assign_tokens(family_codes("causal", 64), 2, "random")


def test_exact_search_finds_the_optimum_on_few_blocks():
    # 7 blocks on 3 ranks: the makespan equals brute force over all 3^7 assignments.
    import itertools

    from megatron_mm.plan.context_parallel.cp_assignment import exact, ours

    rng = np.random.default_rng(0)
    for _ in range(10):
        load = rng.integers(1, 20, size=7).astype(float)
        best = min(max(sum(load[i] for i in range(7) if a[i] == r) for r in range(3))
                   for a in itertools.product(range(3), repeat=7))
        owner = ours(load, 3)
        assert max(load[owner == r].sum() for r in range(3)) == best
        from_lpt = exact(load, lpt(load, 3), 3)
        assert max(load[from_lpt == r].sum() for r in range(3)) == best
