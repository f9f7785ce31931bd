"""Iteration-time formula, in-flight micro-batches, memory and p2p terms."""

import dataclasses

import pytest

from megatron_mm.plan import (Hardware, MemoryModel, StagePartition, estimate,
                              inflight_microbatches)

from helpers import layer, vlm_chain

HW = Hardware(peak_flops=1.0, efficiency=1.0)  # seconds == FLOPs


def equal_llm(n, fwd=1.0):
    return [dataclasses.replace(l, needs_dgrad=True) for l in
            [layer("llm_layer", i, fwd=fwd, trainable=True) for i in range(n)]]


@pytest.mark.parametrize("pp,m", [(1, 1), (2, 8), (4, 8), (4, 3)])
def test_1f1b_equal_stages(pp, m):
    chain = equal_llm(2 * pp)  # each layer 3 s (F + dgrad + wgrad)
    est = estimate(chain, StagePartition(pp, 1, [2] * pp), m, HW)
    t = 6.0
    assert est.iteration_s == pytest.approx((m + pp - 1) * t)
    assert est.bubble_s == pytest.approx((pp - 1) * t) and est.schedule == "1f1b"
    assert est.stage_forward_s == [2.0] * pp and est.stage_backward_s == [4.0] * pp


def test_1f1b_uneven_stages_is_sum_plus_m_minus_1_max():
    chain = equal_llm(6)
    est = estimate(chain, StagePartition(3, 1, [1, 3, 2]), 5, HW)
    times = [3.0, 9.0, 6.0]
    assert est.stage_time_s == times and est.bottleneck_stage == 1
    assert est.iteration_s == pytest.approx(sum(times) + 4 * max(times))


def test_interleaved_bubble_shrinks_by_vpp():
    chain = equal_llm(8)
    est = estimate(chain, StagePartition(2, 4, [1] * 8), 6, HW)
    t_rank = 4 * 3.0
    assert est.schedule == "interleaved-1f1b"
    assert est.iteration_s == pytest.approx(6 * t_rank + (2 - 1) * t_rank / 4)


def test_inflight_microbatches():
    assert [inflight_microbatches(4, 1, r) for r in range(4)] == [[4], [3], [2], [1]]
    assert [inflight_microbatches(4, 1, r, 2) for r in range(4)] == [[2], [2], [2], [1]]
    # Megatron interleaved warm-up: 2 (PP - r - 1) + (VPP - 1) PP forwards, plus one; the
    # k-th forward goes to local chunk (k // PP) % VPP
    assert inflight_microbatches(4, 2, 0, 8) == [7, 4]  # 11 forwards: 4 + 4 + 3
    assert inflight_microbatches(4, 2, 3, 8) == [4, 1]  # 5 forwards
    assert inflight_microbatches(4, 2, 0, 2) == [4, 0]  # capped at M x VPP = 4


def test_memory_per_stage():
    chain = [dataclasses.replace(l, params=10.0, act_bytes=100.0, recompute_act_bytes=7.0)
             for l in vlm_chain(2, 4, freeze_vit=True, freeze_llm=True, recompute=True)]
    # stage 0: llm_embed, vision_embed, 2 frozen ViT layers, trained projector
    # stage 1: 4 frozen LLM layers (input grads, recompute) + head (no recompute)
    est = estimate(chain, StagePartition(2, 1, [5, 5]), 8, HW)
    assert est.stage_param_bytes == [4 * 10 * 2 + 10 * 16, 5 * 10 * 2]
    assert est.inflight_microbatches == [[2], [1]]
    # the frozen embedding and ViT layers keep nothing (no backward reaches them); projector 100
    assert est.stage_activation_bytes == [2 * 100, 1 * (4 * 7 + 100)]
    assert est.stage_memory_bytes[0] == est.stage_param_bytes[0] + 200


def test_p2p_transfer_on_the_critical_path():
    hw = Hardware(peak_flops=1.0, efficiency=1.0, p2p_bandwidth=10.0, p2p_latency_s=0.5)
    chain = [dataclasses.replace(l, out_bytes=20.0)
             for l in vlm_chain(2, 2, freeze_vit=True, freeze_llm=True)]
    free = estimate(chain, StagePartition(2, 1, [2, 6]), 4, HW)
    paid = estimate(chain, StagePartition(2, 1, [2, 6]), 4, hw)
    # the cut follows the frozen ViT embedding: the text embeddings and the ViT hidden state
    # go forward (0.5 + 4 s), no gradient comes back (nothing before the cut trains)
    assert paid.boundary_comm_s == [4.5]
    assert paid.iteration_s == pytest.approx(free.iteration_s + 4.5)
    # after the trained projector: the merged embeddings forward, their gradient back
    later = estimate(chain, StagePartition(2, 1, [5, 3]), 4, hw)
    assert later.boundary_comm_s == [5.0]


def test_memory_model_bytes():
    m = MemoryModel()
    assert m.param_bytes(10, True) == 160 and m.param_bytes(10, False) == 20
