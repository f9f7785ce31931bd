"""OmniBal partition search: anchor, +-r neighbourhood, ranking by balance and bytes."""

import pytest

from megatron_mm.plan import PlanError
from megatron_mm.plan.pipeline.partition_search import (PartitionCandidate, anchor_partition,
                                                        candidates, fastest, rank, score, table)

from helpers import layer, vlm_chain


def test_anchor_cuts_where_running_sum_reaches_share():
    assert anchor_partition([1] * 8, 4) == [2, 2, 2, 2]
    assert anchor_partition([4, 1, 1, 1, 1], 2) == [1, 4]
    # a heavy tail must still leave every later chunk a layer
    assert anchor_partition([1, 1, 1, 9], 3) == [2, 1, 1]
    with pytest.raises(PlanError):
        anchor_partition([1, 1], 3)


def test_radius_one_gives_three_to_the_stages_minus_one():
    chain = vlm_chain(4, 8)  # 15 layers, unit forward
    found = candidates(chain, 4, 1, radius=1)
    assert len(found) == 3 ** 3
    assert all(sum(c.layers_per_chunk) == len(chain) for c in found)
    assert len({tuple(c.layers_per_chunk) for c in found}) == len(found)
    found2 = candidates(chain, 2, 1, radius=2)
    assert len(found2) == 5
    assert [c.layers_per_chunk for c in candidates(chain, 2, 1, radius=0)] == \
        [anchor_partition([l.total_flops for l in chain], 2)]


def test_boundaries_never_leave_a_stage_empty():
    chain = vlm_chain(1, 2)  # 6 layers
    found = candidates(chain, 3, 1, radius=3)
    assert found and all(min(c.layers_per_chunk) >= 1 for c in found)


def test_score_variance_and_boundary_bytes_by_hand():
    times = [3.0, 1.0, 1.0, 1.0, 2.0]
    chain = [layer("llm_layer", i, out=10.0 * (i + 1)) for i in range(5)]
    c = score(chain, [2, 3], 2, times)
    assert c.rank_times == [4.0, 4.0] and c.variance == 0.0 and c.boundary_bytes == 20.0
    c = score(chain, [1, 2, 1, 1], 2, times)  # VPP 2: chunks 0, 2 on rank 0
    assert c.rank_times == [4.0, 4.0] and c.boundary_bytes == 10 + 30 + 40


def test_ranking_prefers_balanced_and_cheap_boundaries():
    # Balanced cuts at 2 or 3 (times 1,1 | 1,1 or ...); the boundary after layer 1 is
    # a big vision activation, after layer 2 a small one.
    times = [1.0, 1.0, 1.0, 1.0]
    chain = [layer("llm_layer", i, out=o) for i, o in enumerate([5.0, 100.0, 1.0, 1.0])]
    found = candidates(chain, 2, 1, radius=1, times=times)
    assert sorted(c.layers_per_chunk for c in found) == [[1, 3], [2, 2], [3, 1]]
    best = rank([score(chain, [2, 2], 2, times), score(chain, [3, 1], 2, times),
                 score(chain, [1, 3], 2, times)])
    # places (variance + bytes): [2,2]: 0 + 2; [3,1]: 1 + 0; [1,3]: 1 + 1. [2,2] and
    # [1,3] tie: the smaller variance goes first
    assert [c.layers_per_chunk for c in best] == [[3, 1], [2, 2], [1, 3]]
    assert [c.layers_per_chunk for c in found] == [[3, 1], [2, 2], [1, 3]]


def test_fastest_and_table():
    a = PartitionCandidate([2, 2], [1, 1], 0.0, 1e6, measured_s=0.5)
    b = PartitionCandidate([3, 1], [2, 0], 1.0, 2e6, measured_s=0.4)
    c = PartitionCandidate([1, 3], [0, 2], 1.0, 3e6)
    assert fastest([a, b, c]) is b
    text = table([a, b, c], "measured profile p.json")
    assert "measured profile p.json" in text and "2,2" in text and "0.4000" in text
    with pytest.raises(PlanError):
        fastest([c])
    assert PartitionCandidate.from_dict(a.to_dict()) == a


def test_radius_too_large_is_refused():
    chain = vlm_chain(20, 40)
    with pytest.raises(PlanError, match="--pipeline-search-radius"):
        candidates(chain, 8, 1, radius=10)
    with pytest.raises(PlanError, match="--pipeline-search-radius"):
        candidates(chain, 2, 1, radius=-1)
