"""The one time model: chunk seconds and the one p2p cost convention."""

import pytest

from megatron_mm.plan import Hardware, StagePartition, estimate
from megatron_mm.plan.costs.hardware import Interconnect
from megatron_mm.plan.costs.unit_costs import TimeModel

from helpers import vlm_chain


def test_one_p2p_convention():
    links = Interconnect(p2p_bandwidth=10.0, p2p_latency_s=0.5)
    assert TimeModel(links=links).p2p_s(20.0) == links.p2p_seconds(20.0) == 2.5
    assert links.p2p_seconds(0.0) == 0.0  # nothing sent: no latency either
    assert TimeModel().p2p_s(20.0) == 0.0  # no links: free
    hw = Hardware(p2p_bandwidth=10.0, p2p_latency_s=0.5)
    assert hw.p2p_links().p2p_seconds(20.0) == 2.5
    assert Hardware().p2p_links() is None


def test_estimate_is_timed_by_the_time_model():
    hw = Hardware(peak_flops=2.0, efficiency=0.5, p2p_bandwidth=10.0, p2p_latency_s=0.5)
    chain = vlm_chain(2, 4, recompute=True)
    part = StagePartition(2, 1, [5, 5])
    est = estimate(chain, part, 4, hw)
    time = TimeModel(hw, hw.p2p_links())
    fwd, bwd = zip(*(time.chunk_s(chain[s:e]) for s, e in part.chunk_bounds()))
    assert est.chunk_forward_s == pytest.approx(list(fwd))
    assert est.chunk_backward_s == pytest.approx(list(bwd))
    assert est.chunk_backward_s[0] > 0
